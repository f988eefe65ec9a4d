"""After sampling: append each new token, detokenize, decide whether the sequence stops, build deltas."""

from __future__ import annotations

from wslm.backend.frontend.detokenizer import Detokenizer
from wslm.backend.outputs import CompletionOutput, Logprob
from wslm.backend.sequence import Sequence


class OutputProcessor:
    def __init__(self, tokenizer, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.detokenizer = Detokenizer(tokenizer)
        self.max_model_len = max_model_len

    def start(self, seq: Sequence) -> None:
        self.detokenizer.start(seq)

    def append_token(self, seq: Sequence, token: int, logprob_info, now: float, grammar_done: bool = False) -> bool:
        """Returns True when seq is now finished (finish_reason set). grammar_done: its structured-output
        grammar is complete, so it stops here (as at EOS) even with ignore_eos or below min_tokens."""
        seq.output_token_ids.append(token)
        if seq.first_token_time is None:
            seq.first_token_time = now
        seq.last_token_time = now
        if logprob_info is not None:
            self._add_logprobs(seq, token, logprob_info)
        p = seq.params
        can_stop = seq.num_output_tokens >= p.min_tokens
        eos = can_stop and not p.ignore_eos and token in seq.eos_token_ids
        stop_token = can_stop and not eos and token in p.stop_token_ids
        # The token that stops the sequence stays in token_ids but not in the text (as vLLM renders it), unless
        # include_stop_str_in_output: visible with skip_special_tokens=False or a plain-word stop token id.
        hide = (eos or stop_token) and not p.include_stop_str_in_output
        prev_len = len(seq.output_text)
        self.detokenizer.update(seq, hide_last=hide)
        if eos:
            seq.finish_reason = "stop"
        elif stop_token:
            seq.finish_reason, seq.stop_reason = "stop", token
        elif can_stop and (stop := self.detokenizer.check_stop_strings(seq, prev_len)) is not None:
            seq.finish_reason, seq.stop_reason = "stop", stop
            return True
        elif grammar_done:
            seq.finish_reason = "stop"
        elif (p.max_tokens is not None and seq.num_output_tokens >= p.max_tokens) or (
            seq.num_tokens >= self.max_model_len
        ):
            seq.finish_reason = "length"
        if seq.finish_reason is None:
            return False
        prev_len = len(seq.output_text)
        self.detokenizer.flush(seq, hide_last=hide)
        if can_stop and (stop := self.detokenizer.check_stop_strings(seq, prev_len)) is not None:
            seq.finish_reason, seq.stop_reason = "stop", stop
        return True

    def _add_logprobs(self, seq: Sequence, token: int, info) -> None:
        chosen, rank, top_ids, top_vals, *wanted_ranks = info
        decode = self.tokenizer.decode
        entry = {token: Logprob(chosen, rank, decode([token]))}
        # The top ids rank 1, 2, ...; requested ids (logprob_token_ids) come with their own ranks.
        ranks = wanted_ranks[0] if wanted_ranks else range(1, len(top_ids) + 1)
        for r, tid, val in zip(ranks, top_ids, top_vals):
            if tid not in entry:
                entry[tid] = Logprob(val, r, decode([tid]))
        seq.logprobs.append(entry)
        seq.cumulative_logprob += chosen

    def delta(self, seq: Sequence, finished: bool) -> CompletionOutput | None:
        """What seq produced since the last delta; None when nothing new is ready."""
        text_end = self.detokenizer.sendable_text_len(seq) if not finished else len(seq.output_text)
        text = seq.output_text[seq.sent_text_len : text_end]
        token_ids = seq.output_token_ids[seq.sent_token_len :]
        if not text and not token_ids and not finished:
            return None
        logprobs = seq.logprobs[seq.sent_token_len :] if seq.params.logprobs is not None else None
        seq.sent_text_len = max(text_end, seq.sent_text_len)
        seq.sent_token_len = seq.num_output_tokens
        return CompletionOutput(
            index=seq.index,
            text=text,
            token_ids=token_ids,
            cumulative_logprob=seq.cumulative_logprob if seq.params.logprobs is not None else None,
            logprobs=logprobs,
            finish_reason=seq.finish_reason if finished else None,
            stop_reason=seq.stop_reason if finished else None,
        )
