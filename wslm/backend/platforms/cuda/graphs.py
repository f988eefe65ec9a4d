"""CUDA graphs for decode steps: one graph per batch size on a ladder, replayed with the batch padded up.

A decode step of a small model is dominated by kernel launches; replaying a captured graph removes
them. Capture uses static input buffers and a fixed max_seqlen_k (max_model_len) so that the kernels'
launch grids do not depend on the step. After capture, every graph is checked against the eager forward
once; any failure or mismatch turns graphs off with a warning (the engine stays correct, just slower)."""

from __future__ import annotations

import logging

import torch

from wslm.backend.modeling.layers.attention import AttentionMetadata

logger = logging.getLogger(__name__)


def batch_size_ladder(max_num_seqs: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, 257, 16))
    return [b for b in sizes if b <= max_num_seqs] or [1]


class DecodeGraphs:
    def __init__(self, model, kv_caches, max_num_seqs: int, max_model_len: int, block_size: int) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.max_model_len = max_model_len
        self.sizes = batch_size_ladder(max_num_seqs)
        self.max_batch = self.sizes[-1]
        self.max_blocks = -(-max_model_len // block_size)
        dev = model.device
        n = self.max_batch
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=dev)
        self.block_tables = torch.zeros(n, self.max_blocks, dtype=torch.int32, device=dev)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=dev)
        self.cu_seqlens = torch.arange(n + 1, dtype=torch.int32, device=dev)
        self.logits_idx = torch.arange(n, dtype=torch.int64, device=dev)
        self.graphs: dict[int, object] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def _meta(self, b: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:b], block_tables=self.block_tables[:b],
            cu_seqlens_q=self.cu_seqlens[: b + 1], seq_lens=self.seq_lens[:b], logits_indices=self.logits_idx[:b],
            max_seqlen_q=1, max_seqlen_k=self.max_model_len,
        )  # fmt: skip

    def _forward(self, b: int) -> torch.Tensor:
        return self.model.forward(self.input_ids[:b], self.positions[:b], self._meta(b), self.kv_caches)

    def _capture_one(self, b: int, pool) -> None:
        self._forward(b)  # warm-up: compiles the kernels outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            self.outputs[b] = self._forward(b)
        self.graphs[b] = graph

    def _replay(self, b: int) -> torch.Tensor:
        self.graphs[b].replay()
        return self.outputs[b]

    def capture(self) -> bool:
        """Capture every size (largest first, sharing one memory pool); False when graphs are off."""
        try:
            pool = torch.cuda.graph_pool_handle() if torch.cuda.is_available() else None
            for b in reversed(self.sizes):
                self._capture_one(b, pool)
            self._self_check()
        except Exception as exc:  # graphs are an optimisation: never a reason not to serve
            logger.warning("CUDA graphs are off (%s: %s); decode runs eagerly.", type(exc).__name__, exc)
            self.graphs.clear()
            self.outputs.clear()
            return False
        logger.info("CUDA graphs captured for decode batch sizes %s", self.sizes)
        return True

    def _self_check(self) -> None:
        # Slot -1 everywhere: the check writes nothing into the KV cache.
        for b in self.sizes:
            self.slot_mapping[:b] = -1
            self.input_ids[:b] = torch.arange(b, device=self.input_ids.device) % 100
            eager = self._forward(b).clone()
            replayed = self._replay(b)
            if not torch.allclose(eager, replayed, atol=1e-2, rtol=1e-2):
                raise RuntimeError(f"graph for batch {b} differs from the eager forward")

    def can_run(self, num_seqs: int) -> bool:
        return bool(self.graphs) and num_seqs <= self.max_batch

    def run(self, input_ids, positions, meta: AttentionMetadata) -> torch.Tensor:
        """A decode batch (one query token per sequence, every sequence sampled) through its graph."""
        n = input_ids.shape[0]
        b = next(s for s in self.sizes if s >= n)
        self.input_ids[:n] = input_ids
        self.positions[:n] = positions
        self.slot_mapping[:n] = meta.slot_mapping
        self.slot_mapping[n:b] = -1  # padding rows write nothing
        self.seq_lens[:n] = meta.seq_lens
        self.seq_lens[n:b] = 1
        width = meta.block_tables.shape[1]
        self.block_tables[:n, :width] = meta.block_tables
        return self._replay(b)[:n]
