"""Token-level stops, decided once, where a sampled token is appended (as nano-vllm and vLLM's scheduler do):
EOS, stop token ids, max_tokens (with min_tokens holding EOS and stop tokens back), the model length and the
end of a structured-output grammar. Stop *strings* need the text, so the front end checks those
(frontend/output_processor.py) and aborts the completion by request id and index."""

from __future__ import annotations

from dataclasses import dataclass

from wslm.backend.sequence import Sequence


@dataclass(slots=True)
class Appended:
    """What append_tokens kept of a step's tokens and why the sequence stopped (if it did)."""

    token_ids: list[int]  # the tokens appended (those after a stop are dropped)
    finish_reason: str | None = None  # "stop" or "length"
    stop_reason: int | None = None  # the stop token id that ended it (None for EOS, lengths, grammar end)
    stopped_on_token: bool = False  # the last appended token is the EOS / stop token id that ended it


def append_tokens(seq: Sequence, token_ids: list[int], max_model_len: int) -> Appended:
    """Append token_ids (one per step, or several from speculative decoding) to seq, feeding its grammar,
    and stop at the first one that ends it."""
    kept: list[int] = []
    for token in token_ids:
        seq.output_token_ids.append(token)
        kept.append(token)
        grammar_done = seq.grammar is not None and seq.grammar.accept(token)
        result = check_stop(seq, token, grammar_done, max_model_len)
        if result is not None:
            reason, stop_reason, on_token = result
            return Appended(kept, reason, stop_reason, on_token)
    return Appended(kept)


def check_stop(seq: Sequence, token: int, grammar_done: bool, max_model_len: int) -> tuple[str, int | None, bool] | None:
    """(finish_reason, stop_reason, stopped_on_token) once seq (token already appended) must stop, else None.
    grammar_done: its structured-output grammar is complete, so it stops here (as at EOS) even with
    ignore_eos or below min_tokens."""
    p = seq.params
    can_stop = seq.num_output_tokens >= p.min_tokens
    if can_stop and not p.ignore_eos and token in seq.eos_token_ids:
        return "stop", None, True
    if can_stop and token in p.stop_token_ids:
        return "stop", token, True
    if grammar_done:
        return "stop", None, False
    if (p.max_tokens is not None and seq.num_output_tokens >= p.max_tokens) or seq.num_tokens >= max_model_len:
        return "length", None, False
    return None
