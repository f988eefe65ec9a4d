"""Per-request token rules applied by the sampler: logit_bias, allowed_token_ids and bad_words (vLLM's)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from wslm.backend.sampling_params import SamplingParams


@dataclass(slots=True)
class TokenRules:
    bias_ids: list[int]
    bias_values: list[float]
    allowed_ids: list[int] | None
    bad_words: list[list[int]]  # token sequences; the last token is banned when the others were just generated

    @classmethod
    def build(cls, params: SamplingParams, tokenizer) -> TokenRules | None:
        """None when the request has no rules (the common case costs the sampler nothing)."""
        if not (params.logit_bias or params.allowed_token_ids or params.bad_words):
            return None
        bias = params.logit_bias or {}
        return cls(list(bias), [float(v) for v in bias.values()], params.allowed_token_ids,
                   bad_word_token_ids(params.bad_words or [], tokenizer))


def bad_word_token_ids(words: list[str], tokenizer) -> list[list[int]]:
    """Each word as it tokenizes at the start of a text and after a space (as vLLM does): "Paris" and
    " Paris" are different tokens in most vocabularies."""
    out: list[list[int]] = []
    for word in words:
        for text in (word.lstrip(), " " + word.lstrip()):
            ids = tokenizer.encode(text, add_special_tokens=False)
            if ids and ids not in out:
                out.append(ids)
    return out


def apply_token_rules(logits: torch.Tensor, seqs: list) -> torch.Tensor:
    """Returns logits with every row's rules applied (a copy when anything changes)."""
    cloned = False
    vocab = logits.shape[1]
    for i, seq in enumerate(seqs):
        rules: TokenRules | None = seq.token_rules
        if rules is None:
            continue
        if not cloned:
            logits, cloned = logits.clone(), True
        row = logits[i]
        if rules.allowed_ids is not None:
            keep = torch.full((vocab,), float("-inf"), device=logits.device)
            keep[torch.tensor(rules.allowed_ids, device=logits.device)] = 0.0
            row += keep
        if rules.bias_ids:
            row.index_add_(0, torch.tensor(rules.bias_ids, device=logits.device),
                           torch.tensor(rules.bias_values, device=logits.device))
        banned = [ids[-1] for ids in rules.bad_words if _ends_with(seq.output_token_ids, ids[:-1])]
        if banned:
            row[torch.tensor(banned, device=logits.device)] = float("-inf")
    return logits


def _ends_with(tokens: list[int], prefix: list[int]) -> bool:
    return not prefix or (len(tokens) >= len(prefix) and tokens[-len(prefix):] == prefix)
