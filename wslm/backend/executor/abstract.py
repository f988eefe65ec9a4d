"""Executor: what the engine core runs its steps through, whether the model lives in this process
(uniproc.py: one Worker, rank 0 of 1) or in one worker per tensor-parallel rank (mp_executor.py,
ray_executor.py). Every form runs a step the same way: execute(SchedulerOutput) builds the step's plain inputs
once (engine/step_inputs.py: StepInputs for every rank, a SamplingBatch for rank 0, the grammar bitmask rows
filled here, where the grammar states live) and hands them to Worker.execute_step; rank 0 samples and answers
with a ModelRunnerOutput (token ids, their logprobs, the prompt_logprobs rows). The core keeps the scheduler
and the block manager; the workers own the weights, the KV pool and the sampler."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from wslm.backend.engine.scheduler_output import SchedulerOutput
from wslm.backend.engine.step_inputs import (
    ModelRunnerOutput,
    SampleRow,
    SamplingBatch,
    StepInputs,
    prepare_step,
)
from wslm.backend.structured.mask import GrammarMasker


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
    device: torch.device  # the model's (the core empties CUDA's cache after an out-of-memory step)
    masker: GrammarMasker  # fills the grammar bitmask rows each step (the engine holds the grammar states)

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step. Raises MemoryError / torch.OutOfMemoryError before anything was computed when
        memory runs out (the core then retries smaller), EngineDeadError when the workers are gone."""
        step, sampled = prepare_step(so.scheduled, self.block_size)
        result = self._execute_step(step, self.sampling_batch(so, sampled))
        return result if result is not None else ModelRunnerOutput([], [], [])

    def sampling_batch(self, so: SchedulerOutput, sampled: list) -> SamplingBatch:
        """What rank 0 samples the step with. sampled: prepare_step's sequences with a logits row, in order."""
        seqs = so.sample_seqs
        rows = so.sample_rows
        drafts = spec_masks = None
        if so.spec is not None:  # a speculating sequence has 1 + k rows: each entry's first row moves down
            starts, r = [], 0
            for seq in sampled:
                starts.append(r)
                r += 1 + len(seq.spec_token_ids)
            rows = [starts[i] for i in rows]
            drafts = [list(seq.spec_token_ids) for seq in seqs]
            spec_masks = [so.spec.bitmasks.get(seq.seq_id) if d else None for seq, d in zip(seqs, drafts)]
        grammar = [(i, seq.grammar) for i, seq in enumerate(seqs)
                   if seq.grammar is not None and not (drafts and drafts[i])]
        for i, state in grammar:
            state.sync(seqs[i].output_token_ids)  # no-op unless the state fell out of step
        return SamplingBatch([SampleRow.of(s) for s in seqs], rows, so.prompt_targets(), [i for i, _ in grammar],
                             self.masker.fill(grammar) if grammar else None, so.finished_seq_ids, drafts, spec_masks)

    @abstractmethod
    def _execute_step(self, step: StepInputs, batch: SamplingBatch | None):
        """Worker.execute_step on every rank; rank 0's answer (a ModelRunnerOutput, None when the step has no
        logits rows, the hidden states for a pooling step)."""

    @abstractmethod
    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy KV blocks (src, dst): an n > 1 request's siblings take their own copy of a partial block."""

    def execute_pooling(self, scheduled: list) -> tuple[torch.Tensor, list]:
        """An embedding step: the hidden states of the sequences whose prompt it completes, and those."""
        step, done = prepare_step(scheduled, self.block_size, pooling=True)
        return self._execute_step(step, None), done

    def warm_up(self, max_num_seqs: int, max_model_len: int, enforce_eager: bool) -> None:
        """Once max_model_len is known (nothing to do by default)."""
        return None

    def decode_row_budget(self) -> int | None:
        """The most rows a decode step runs on its fastest path (None: no such limit). Speculation keeps a batch's
        verification rows within it: past it a CPU step leaves the C rows step for the batched one."""
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
    so only token ids (and the logprobs asked for) come back over the pipe."""

    vocab_size: int

    def _call_all(self, method: str, *args) -> list:
        raise NotImplementedError

    def _execute_step(self, step: StepInputs, batch: SamplingBatch | None):
        return self._call_all("execute_step", step, batch)[0]

    def execute_pooling(self, scheduled: list) -> tuple[torch.Tensor, list]:
        raise ValueError("Embedding models run on one device here: drop --tensor-parallel-size.")

    def warm_up(self, max_num_seqs: int, max_model_len: int, enforce_eager: bool) -> None:
        graphs = self._call_all("warm_up", max_num_seqs, max_model_len, enforce_eager)
        if any(graphs) and not all(graphs):  # one rank without its graphs: the others' collectives would not meet
            self._call_all("drop_cuda_graphs")

    # start_background_compile stays the no-op: the CPU plan declines under tensor parallelism, so the ranks have
    # nothing to compile, and a call from the server's thread could cross a step's messages on the pipes.

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:
            self._call_all("copy_blocks", pairs)

    def _start(self, init_args: list[tuple], config, model_config) -> None:
        """The start-up sequence both executors share; init_args: Worker.init_device's, per rank."""
        self.vocab_size = model_config.vocab_size
        self.device = torch.device("cpu")  # the ranks' memory is theirs: nothing to free in this process
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
