"""The engine core's side of speculative decoding: before each schedule, proposals for the running decodes
(n-gram lookup here; a draft model gets placeholder slots, filled by the executor); after scheduling, the
grammar rows of constrained sequences at every verified position; after the step, the counters vLLM exports
and the blocks of rejected tokens given back. Token ids and Sequences only: no engine imports (this folder sits
beside the pipeline)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from wslm.backend.spec_decode.adaptive import AdaptiveK
from wslm.backend.spec_decode.config import SpeculativeConfig
from wslm.backend.spec_decode.ngram import propose_ngram

logger = logging.getLogger("wslm.engine")


@dataclass(slots=True)
class SpecBatch:
    """What travels with a SchedulerOutput when some sequence speculates (uniproc executors only)."""

    seqs: list  # the scheduled sequences with spec_token_ids, in batch order
    bitmasks: dict[int, Any] = field(default_factory=dict)  # seq_id -> xgrammar bitmask [k + 1, words]


class Speculator:
    def __init__(self, config: SpeculativeConfig, max_model_len: int, vocab_size: int) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        # vLLM's counters (vllm:spec_decode_*): runs verified, tokens proposed, proposed tokens accepted.
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self._said: set[str] = set()
        self.adaptive = AdaptiveK()  # fewer or no proposals where a sequence's are mostly rejected

    def _once(self, key: str, message: str, *args) -> None:
        if key not in self._said:
            self._said.add(key)
            logger.info(message, *args)

    def _room(self, seq) -> int:
        """How many tokens seq may speculate: k, less what max_tokens and the context still allow."""
        k = self.config.num_speculative_tokens
        p = seq.params
        if p.max_tokens is not None:
            k = min(k, p.max_tokens - seq.num_output_tokens - 1)
        return min(k, self.max_model_len - seq.num_tokens - 1)

    def propose(self, running: list, row_budget: int | None = None) -> None:
        """Set spec_token_ids on each running decode ([] where nothing is proposed). row_budget: the most rows a
        decode step runs on its fast path (Executor.decode_row_budget): each decode's proposals are capped so
        that the step's rows stay within it (several CPU chats: past 15 rows a step leaves the C rows step for
        the batched one, which costs more than speculation saves)."""
        cfg = self.config
        if len(self.adaptive) > 4 * len(running) + 256:  # forget finished sequences now and then
            self.adaptive.forget({seq.seq_id for seq in running})
        decodes = [seq for seq in running
                   if seq.num_tokens - seq.num_computed_tokens == 1 and seq.pooling is None and not seq.pending_forks]
        share = None if row_budget is None else row_budget // max(1, len(decodes)) - 1
        for seq in running:
            seq.spec_token_ids = []
        for seq in decodes:
            k = self._room(seq) if share is None else min(self._room(seq), share)
            if k <= 0:
                continue
            k = self.adaptive.limit(seq.seq_id, k)
            if k <= 0:
                continue
            if cfg.method == "ngram":
                drafts = propose_ngram(seq.token_ids(), k, cfg.prompt_lookup_min, cfg.prompt_lookup_max)
            elif seq.grammar is not None:
                self._once("draft-grammar", "Speculative decoding: a draft model does not propose for requests with "
                           "structured output (a grammar); they decode one token per step")
                continue
            else:
                drafts = [0] * k  # the draft model fills them in the executor
            if drafts and seq.grammar is not None:
                drafts = self._grammar_prefix(seq.grammar, seq.output_token_ids, drafts)
            seq.spec_token_ids = drafts

    @staticmethod
    def _grammar_prefix(grammar, output_token_ids: list[int], drafts: list[int]) -> list[int]:
        """The drafts the grammar allows (each after the ones before it), stopping before one that ends it (the
        position after it would have no token to verify)."""
        grammar.sync(output_token_ids)
        m = grammar.matcher
        n = 0
        for t in drafts:
            if not m.accept_token(t):
                break
            n += 1
            if m.is_terminated():
                n -= 1
                m.rollback(1)
                break
        if n:
            m.rollback(n)
        return drafts[:n]

    def batch(self, scheduled: list) -> SpecBatch | None:
        """After scheduling: the speculating sequences and their grammar rows; None when none speculates."""
        seqs = [seq for seq, _ in scheduled if seq.spec_token_ids]
        if not seqs:
            return None
        out = SpecBatch(seqs)
        for seq in seqs:
            if seq.grammar is not None:
                out.bitmasks[seq.seq_id] = self._grammar_rows(seq)
        return out

    def _grammar_rows(self, seq) -> Any:
        import xgrammar as xgr

        drafts = seq.spec_token_ids
        bitmask = xgr.allocate_token_bitmask(len(drafts) + 1, self.vocab_size)
        g = seq.grammar
        g.sync(seq.output_token_ids)
        for i in range(len(drafts) + 1):
            g.fill_mask(bitmask, i)
            if i < len(drafts):
                g.matcher.accept_token(drafts[i])
        if drafts:
            g.matcher.rollback(len(drafts))
        return bitmask

    def timed(self, scheduled: list, seconds: float) -> None:
        """A step's wall time (executing and sampling). A step that decoded one sequence alone tells the
        adaptive K what its extra verification rows cost here (the only case whose rows are all one chat's)."""
        if len(scheduled) != 1:
            return
        seq, n = scheduled[0]
        if n == 1 + len(seq.spec_token_ids):  # a decode (a prefill chunk schedules its prompt's tokens)
            self.adaptive.observe(n, seconds)

    def verified(self, seq, num_new: int, block_manager) -> None:
        """seq's run is settled: num_new tokens (accepted drafts + one). Count, and give back the blocks past
        what its computed tokens fill (the rejected tokens' slots)."""
        k = len(seq.spec_token_ids)
        self.adaptive.record(seq.seq_id, k, num_new - 1)
        self.num_drafts += 1
        self.num_draft_tokens += k
        self.num_accepted_tokens += num_new - 1
        seq.spec_token_ids = []
        block_manager.trim(seq, seq.num_computed_tokens)

    def stats(self) -> dict:
        return {"spec_decode_num_drafts": self.num_drafts, "spec_decode_num_draft_tokens": self.num_draft_tokens,
                "spec_decode_num_accepted_tokens": self.num_accepted_tokens}
