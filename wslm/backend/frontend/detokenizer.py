"""Incremental detokenizer: turns new token ids into new text without ever emitting half a UTF-8
character, and cuts stop strings exactly (holding back a possible stop-string prefix while streaming)."""

from __future__ import annotations

from typing import Any

# How many prompt tokens to decode along with the first output tokens, so that a leading space or a
# multi-token character at the start of the output comes out as it would in the middle of a text.
_PROMPT_CONTEXT = 5


class Detokenizer:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def start(self, seq: Any) -> None:
        seq.read_offset = len(seq.prompt_token_ids)
        seq.prefix_offset = max(seq.read_offset - _PROMPT_CONTEXT, 0)

    def _decode(self, seq: Any, ids: list[int]) -> str:
        p = seq.params
        return self.tokenizer.decode(
            ids,
            skip_special_tokens=p.skip_special_tokens,
            clean_up_tokenization_spaces=False,
        )

    def update(self, seq: Any, final: bool = False, hide_last: bool = False) -> None:
        """Fold the newest output token(s) into seq.output_text. hide_last: the newest token stopped the
        sequence (EOS or a stop token id) and is not rendered into the text, as vLLM leaves it out."""
        all_ids = seq.token_ids()
        if hide_last:
            all_ids = all_ids[:-1]
        prefix_text = self._decode(seq, all_ids[seq.prefix_offset : seq.read_offset])
        new_text = self._decode(seq, all_ids[seq.prefix_offset :])
        if final:
            # The reply was cut inside a character (max_tokens, a stop token): its bytes cannot become text.
            # The held-back tail is dropped (the token ids still carry it); a U+FFFD the model wrote as a
            # whole character right at the end goes with it: the two cannot be told apart here.
            new_text = new_text.rstrip("\ufffd")
        if len(new_text) > len(prefix_text) and (final or not new_text.endswith("\ufffd")):
            seq.output_text += new_text[len(prefix_text) :]
            seq.prefix_offset = seq.read_offset
            seq.read_offset = len(all_ids)

    def flush(self, seq: Any, hide_last: bool = False) -> None:
        """At the end, release text held back while a character was unfinished (what is still unfinished
        is dropped)."""
        if seq.read_offset < seq.num_tokens - hide_last:
            self.update(seq, final=True, hide_last=hide_last)

    @staticmethod
    def check_stop_strings(seq: Any, prev_len: int) -> str | None:
        """Cut output_text at the first stop string that the newest text completes."""
        stops = seq.params.stop
        if not stops:
            return None
        text = seq.output_text
        best: tuple[int, str] | None = None
        for stop in stops:
            idx = text.find(stop, max(prev_len - len(stop) + 1, 0))
            if idx != -1 and (best is None or idx < best[0]):
                best = (idx, stop)
        if best is not None:
            idx, stop = best
            seq.output_text = text[: idx + len(stop)] if seq.params.include_stop_str_in_output else text[:idx]
            return stop
        return None

    @staticmethod
    def sendable_text_len(seq: Any) -> int:
        """How much of output_text may be streamed now: a tail that could begin a stop string waits."""
        if seq.is_finished or not seq.params.stop:
            return len(seq.output_text)
        hold = max(len(s) for s in seq.params.stop) - 1
        return max(len(seq.output_text) - hold, seq.sent_text_len)
