"""Executor: what the engine core runs its steps through, whether the model lives in this process
(uniproc.py) or in one worker per tensor-parallel rank (mp_executor.py, ray_executor.py).

One call a step: execute(SchedulerOutput) -> ModelRunnerOutput (sampled token ids, their logprobs, the
prompt_logprobs rows). The core keeps the scheduler and the block manager; the executor owns the weights,
the KV pool and the sampler."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from wslm.backend.structured.mask import GrammarMasker
from wslm.backend.worker.step_inputs import (
    ModelRunnerOutput,
    SampleRow,
    SamplingBatch,
    SchedulerOutput,
    prepare_step,
)


def kv_cache_note(size: int, num_blocks: int, num_kv_heads: int) -> str:
    """The start log's KV line under tensor parallelism: every rank holds every block, for its own KV
    heads, so the pool's token capacity is the block count's and the memory logged is per rank."""
    if size == 1:
        return ""
    per = max(1, num_kv_heads // size)
    return f" per rank; each of {size} ranks holds these {num_blocks} blocks for its {per} of {num_kv_heads} KV heads"


class Executor(ABC):
    """The engine core's one view of the model. Built by make_executor (executor/__init__.py): it loads the
    weights and sizes the KV pool (num_blocks); warm_up() then prepares what depends on the context length
    (CUDA graphs, the compiled CPU decode step)."""

    block_size: int
    num_blocks: int
    kv_cache_bytes: int  # per rank under tensor parallelism
    device: torch.device  # where sampling runs: seeded requests keep their generator there

    @abstractmethod
    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step. Raises MemoryError / torch.OutOfMemoryError before anything was computed when
        memory runs out (the core then retries smaller), EngineDeadError when the workers are gone."""

    @abstractmethod
    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy KV blocks (src, dst): an n > 1 request's siblings take their own copy of a partial block."""

    def execute_pooling(self, scheduled: list) -> tuple[torch.Tensor, list]:
        raise ValueError("Embedding models run on one device here: drop --tensor-parallel-size.")

    def warm_up(self, max_num_seqs: int, max_model_len: int, enforce_eager: bool) -> None:
        """Once max_model_len is known (nothing to do by default)."""
        return None

    def start_background_compile(self) -> None:
        """Start compiling, in the background, what warm_up() left for later (nothing by default)."""
        return None

    def check_health(self) -> None:
        """Raises EngineDeadError when the workers are gone."""
        return None

    def shutdown(self) -> None:
        """Stop the workers, if any (idempotent; also runs at exit)."""
        return None


class TPExecutorBase(Executor):
    """Tensor parallelism: every rank runs the step on its shard; rank 0 samples from the gathered logits,
    so only token ids (and the logprobs asked for) come back over the pipe. The grammar states stay here:
    their bitmask rows go with the step."""

    vocab_size: int

    def _call_all(self, method: str, *args) -> list:
        raise NotImplementedError

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        step, _ = prepare_step(so.scheduled, self.block_size)
        grammar = [(i, seq.grammar) for i, seq in enumerate(so.sample_seqs) if seq.grammar is not None]
        for i, state in grammar:
            state.sync(so.sample_seqs[i].output_token_ids)  # no-op unless the state fell out of step
        batch = SamplingBatch([SampleRow.of(s) for s in so.sample_seqs], so.sample_rows, so.prompt_targets(),
                              [i for i, _ in grammar], self.masker.fill(grammar) if grammar else None,
                              so.finished_seq_ids)
        result = self._call_all("execute_step", step, batch)[0]
        return result if result is not None else ModelRunnerOutput([], [], [])

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:
            self._call_all("copy_blocks", pairs)

    def _start(self, init_args: list[tuple], config, model_config) -> None:
        """The start-up sequence both executors share; init_args: Worker.init_device's, per rank."""
        self.vocab_size = model_config.vocab_size
        self.device = torch.device("cpu")  # the engine's generators are unused: rank 0 keeps its own
        self.masker = GrammarMasker(model_config.vocab_size)
        self.pids = self._call_each("init_device", init_args)
        # Rank 0 loads first: a GGUF's first load writes the converted-copy cache that the others then read.
        self._call_some([0], "load_model")
        if len(init_args) > 1:
            self._call_some(list(range(1, len(init_args))), "load_model")
        self.num_blocks = min(self._call_all("determine_num_blocks"))
        self.kv_cache_bytes = self._call_all("init_cache", self.num_blocks)[0]

    def _call_each(self, method: str, per_rank_args: list[tuple]) -> list:
        raise NotImplementedError

    def _call_some(self, ranks: list[int], method: str, *args) -> list:
        raise NotImplementedError

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001
            pass
