"""N-gram prompt lookup (vLLM's "ngram" method): find an earlier occurrence of the context's last n tokens
(the longest n from prompt_lookup_max down to prompt_lookup_min; the most recent on a tie) and propose the
tokens that followed it. Editing code or quoting a document repeats long runs of the prompt, which this
predicts at no model cost."""

from __future__ import annotations


def propose_ngram(tokens: list[int], k: int, n_min: int, n_max: int, window: int = 4096) -> list[int]:
    """Up to k tokens to propose after `tokens` ([] when no n-gram of the suffix recurs). Only the last
    `window` tokens are searched, so a long context costs a bounded time per step (list.index runs in C)."""
    total = len(tokens)
    if k <= 0 or total < n_min + 1:
        return []
    last = tokens[-1]
    best_len, best_end = 0, -1
    i, stop = max(0, total - window), total - 1
    while True:
        try:
            i = tokens.index(last, i, stop)
        except ValueError:
            break
        m = 1  # how many tokens match, ending at i and at the context's end
        while m < n_max and i - m >= 0 and tokens[i - m] == tokens[total - 1 - m]:
            m += 1
        if m >= n_min and m >= best_len:
            best_len, best_end = m, i
        i += 1
    return tokens[best_end + 1 : best_end + 1 + k] if best_end >= 0 else []
