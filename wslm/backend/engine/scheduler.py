"""Scheduler in the style of vLLM v1: one token budget per step shared by decodes and (chunked)
prefills, FCFS, preemption by recompute when the KV pool runs out."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from wslm.backend.config import EngineConfig
from wslm.backend.engine.block_manager import BlockManager
from wslm.backend.multimodal import whole_images
from wslm.backend.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class ScheduledBatch:
    """The scheduler's pick for one step (the core makes the executor's SchedulerOutput from it)."""

    # (sequence, number of its tokens to compute this step), in batch order.
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """Fairness: decodes come first and always get their token; while any stream is decoding, prefill work
    (long prompts, fan-out siblings recomputing) gets at most long_prefill_token_threshold tokens per step in
    total, and one request adds at most fanout_per_step new sequences per step. So a running stream gains one
    token every step, and a step computes at most (decodes + threshold) tokens, however large the prompt or n
    of a newcomer."""

    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        threshold = config.long_prefill_token_threshold
        self.long_prefill_token_threshold = threshold or max(block_manager.block_size, self.max_num_batched_tokens // 8)
        self.fanout_per_step = config.fanout_per_step
        # LoRA adapters among the running sequences at most (the worker keeps that many resident); 0: no LoRA.
        self.max_loras = getattr(config, "max_loras", 0) if getattr(config, "enable_lora", False) else 0
        self.block_manager = block_manager
        self.configured = (self.max_num_batched_tokens, self.max_num_seqs)  # shrink() / step_succeeded()
        self._good_steps = 0
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        out = ScheduledBatch()
        budget = self.max_num_batched_tokens
        bm = self.block_manager
        # Budget held back for the decodes still to come in the running list (they are never starved).
        decodes_left = sum(1 for s in self.running if s.num_tokens - s.num_computed_tokens == 1)
        prefill_budget = self.long_prefill_token_threshold if decodes_left else budget

        # 1. Running sequences first (decodes and unfinished prefill chunks), oldest first.
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            remaining = seq.num_tokens - seq.num_computed_tokens
            if remaining == 1:
                decodes_left -= 1
                num_new = 1
                if seq.spec_token_ids:  # speculative decoding: its drafts are verified in this step too
                    del seq.spec_token_ids[max(0, budget - decodes_left - 1):]
                    num_new += len(seq.spec_token_ids)
            else:
                num_new = min(remaining, budget - decodes_left, prefill_budget)
                if seq.images and num_new > 0:
                    num_new = whole_images(seq.images, seq.num_computed_tokens, num_new)
                if num_new <= 0:
                    i += 1  # this prefill waits a step: the decodes behind it go first
                    continue
            while not bm.allocate_slots(seq, num_new):
                if seq.spec_token_ids:  # no room for the drafts: decode one token, as without speculation
                    seq.spec_token_ids = []
                    num_new = 1
                    continue
                # Out of blocks: preempt the newest running sequence (maybe this one) and recompute it later.
                # Victims come from the end, so none of them was scheduled in this step already.
                victim = self.running.pop()
                if victim is not seq and victim.num_tokens - victim.num_computed_tokens == 1:
                    decodes_left -= 1
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            else:
                out.scheduled.append((seq, num_new))
                budget -= num_new
                if remaining != 1:
                    prefill_budget -= num_new
                i += 1
                continue
            break

        # 2. Waiting sequences, unless this step already had to preempt; at most fanout_per_step new
        # sequences per request, and prefill within what the decodes leave (see the class doc).
        now = time.monotonic()
        admitted: dict[str, int] = {}
        skipped: list[Sequence] = []
        loras = {s.lora_int_id for s in self.running if s.lora_int_id} if self.max_loras else set()
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not out.preempted:
            seq = self.waiting[0]
            if admitted.get(seq.request_id, 0) >= self.fanout_per_step:
                skipped.append(self.waiting.popleft())  # its request had its share this step
                continue
            if seq.lora_int_id and seq.lora_int_id not in loras and len(loras) >= self.max_loras:
                skipped.append(self.waiting.popleft())  # waits until an adapter of the running ones is idle
                continue
            # prompt_logprobs need the logits of every prompt position: no prefix-cache hit (as in vLLM).
            computed = bm.get_computed_blocks(seq) if getattr(seq.params, "prompt_logprobs", None) is None else []
            num_cached = len(computed) * bm.block_size
            num_new = min(seq.num_tokens - num_cached, budget, prefill_budget)
            if seq.images and num_new > 0:
                num_new = whole_images(seq.images, num_cached, num_new)
            if num_new <= 0 or not bm.allocate_slots(seq, num_new, computed):
                break
            self.waiting.popleft()
            admitted[seq.request_id] = admitted.get(seq.request_id, 0) + 1
            seq.num_computed_tokens = num_cached
            if seq.num_cached_tokens < 0:
                seq.num_cached_tokens = num_cached
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = now
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            if seq.lora_int_id:
                loras.add(seq.lora_int_id)
            out.scheduled.append((seq, num_new))
            budget -= num_new
            prefill_budget -= num_new
        self.waiting.extendleft(reversed(skipped))  # back at the front, in their order
        return out

    def shrink(self, step_tokens: int, step_seqs: int) -> tuple[int, int]:
        """After out-of-memory: at most half the failed step's tokens (and new sequences) per step."""
        self.max_num_batched_tokens = max(1, min(self.max_num_batched_tokens, step_tokens // 2))
        self.max_num_seqs = max(1, min(self.max_num_seqs, max(len(self.running), step_seqs) // 2))
        self._good_steps = 0
        return self.max_num_batched_tokens, self.max_num_seqs

    def step_succeeded(self) -> None:
        """After a shrink, double the limits back (up to the configured ones) every 32 good steps."""
        if (self.max_num_batched_tokens, self.max_num_seqs) == self.configured:
            return
        self._good_steps += 1
        if self._good_steps >= 32:
            self._good_steps = 0
            self.max_num_batched_tokens = min(self.configured[0], self.max_num_batched_tokens * 2)
            self.max_num_seqs = min(self.configured[1], self.max_num_seqs * 2)

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.spec_token_ids = []
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence) -> None:
        """Drop a sequence wherever it is and give its blocks back."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass  # a pending fork that was never queued
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED

    def adopt_running(self, seq: Sequence) -> None:
        """A forked sibling that already holds its KV joins the running batch directly."""
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
