"""What the engine needs from a tensor-parallel executor, and the errors it raises. The engine keeps the
scheduler, block manager and sampler; an executor runs the model's ranks and returns rank 0's logits."""

from __future__ import annotations

import numpy as np
import torch

from wslm.backend.sequence import Sequence
from wslm.backend.worker.step_inputs import prepare_step


def kv_cache_note(size: int, num_blocks: int, num_kv_heads: int) -> str:
    """The start log's KV line under tensor parallelism: every rank holds every block, for its own KV
    heads, so the pool's token capacity is the block count's and the memory logged is per rank."""
    if size == 1:
        return ""
    per = max(1, num_kv_heads // size)
    return f" per rank; each of {size} ranks holds these {num_blocks} blocks for its {per} of {num_kv_heads} KV heads"


class TPExecutorBase:
    """Duck-types the parts of ModelRunner the engine calls: execute, copy_blocks, shutdown."""

    block_size: int
    num_blocks: int
    kv_cache_bytes: int  # per rank

    def _call_all(self, method: str, *args) -> list:
        raise NotImplementedError

    def shutdown(self) -> None:
        raise NotImplementedError

    def execute(self, scheduled: list[tuple[Sequence, int]]) -> tuple[torch.Tensor | None, list[Sequence]]:
        step, sampled = prepare_step(scheduled, self.block_size)
        results = self._call_all("execute_step", step)
        logits = results[0]
        if logits is None:
            return None, sampled
        return torch.from_numpy(np.require(logits, requirements="W")), sampled  # Ray hands read-only arrays

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:
            self._call_all("copy_blocks", pairs)

    def _start(self, init_args: list[tuple]) -> None:
        """The start-up sequence both executors share; init_args: Worker.init_device's, per rank."""
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
