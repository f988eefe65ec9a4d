"""Scheduler in the style of vLLM v1: one token budget per step shared by decodes and (chunked)
prefills, FCFS, preemption by recompute when the KV pool runs out."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from wslm.backend.block_manager import BlockManager
from wslm.backend.config import EngineConfig
from wslm.backend.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class SchedulerOutput:
    # (sequence, number of its tokens to compute this step), in batch order.
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        bm = self.block_manager

        # 1. Running sequences first (decodes and unfinished prefill chunks), oldest first.
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not bm.allocate_slots(seq, num_new):
                # Out of blocks: preempt the newest running sequence (maybe this one) and recompute it later.
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            else:
                out.scheduled.append((seq, num_new))
                budget -= num_new
                i += 1
                continue
            break

        # 2. Waiting sequences, unless this step already had to preempt.
        now = time.monotonic()
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not out.preempted:
            seq = self.waiting[0]
            # prompt_logprobs need the logits of every prompt position: no prefix-cache hit (as in vLLM).
            computed = bm.get_computed_blocks(seq) if seq.params.prompt_logprobs is None else []
            num_cached = len(computed) * bm.block_size
            num_new = min(seq.num_tokens - num_cached, budget)
            if not bm.allocate_slots(seq, num_new, computed):
                break
            self.waiting.popleft()
            seq.num_computed_tokens = num_cached
            if seq.num_cached_tokens < 0:
                seq.num_cached_tokens = num_cached
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = now
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append((seq, num_new))
            budget -= num_new
        return out

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
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
