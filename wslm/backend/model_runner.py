"""ModelRunner: owns the weights and the KV pool, turns a scheduled batch into tensors and runs it."""

from __future__ import annotations

import logging

import torch

from wslm.backend.modeling.llama import AttentionMetadata, LlamaModel
from wslm.backend.sequence import Sequence

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, model: LlamaModel, block_size: int, num_blocks: int) -> None:
        self.model = model
        self.cfg = model.cfg
        self.device = model.device
        self.block_size = block_size
        self.num_blocks = num_blocks
        shape = (num_blocks, block_size, self.cfg.num_kv_heads, self.cfg.head_dim)
        # One allocation for the whole pool: [layers, k|v, blocks, block_size, kv_heads, head_dim].
        self.kv_pool = torch.zeros((self.cfg.num_layers, 2, *shape), dtype=self.cfg.dtype, device=self.device)
        self.kv_caches = [(self.kv_pool[i, 0], self.kv_pool[i, 1]) for i in range(self.cfg.num_layers)]
        self.graphs = None  # DecodeGraphs, when CUDA graphs are on

    def enable_cuda_graphs(self, max_num_seqs: int, max_model_len: int) -> None:
        from wslm.backend.cuda_graphs import DecodeGraphs

        graphs = DecodeGraphs(self.model, self.kv_caches, max_num_seqs, max_model_len, self.block_size)
        if graphs.capture():
            self.graphs = graphs

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        if not pairs:
            return
        src = torch.tensor([s for s, _ in pairs], device=self.device)
        dst = torch.tensor([d for _, d in pairs], device=self.device)
        self.kv_pool[:, :, dst] = self.kv_pool[:, :, src]

    def prepare(self, scheduled: list[tuple[Sequence, int]]):
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        cu = [0]
        seq_lens: list[int] = []
        logits_idx: list[int] = []
        sampled: list[Sequence] = []
        max_q = 0
        for seq, n in scheduled:
            start = seq.num_computed_tokens
            end = start + n
            input_ids.extend(seq.tokens_slice(start, end))
            positions.extend(range(start, end))
            table = seq.block_table
            if n == 1:
                slots.append(table[start // bs] * bs + start % bs)
            else:
                slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            cu.append(cu[-1] + n)
            seq_lens.append(end)
            max_q = max(max_q, n)
            if end == seq.num_tokens:  # reached the end of what is known: a new token is due
                logits_idx.append(cu[-1] - 1)
                sampled.append(seq)
        max_blocks = -(-max(seq_lens) // bs)
        tables = [seq.block_table[:max_blocks] + [0] * (max_blocks - len(seq.block_table)) for seq, _ in scheduled]
        dev = self.device

        def t(values, dtype):
            return torch.tensor(values, dtype=dtype, device=dev)

        meta = AttentionMetadata(
            slot_mapping=t(slots, torch.int64),
            block_tables=t(tables, torch.int32),
            cu_seqlens_q=t(cu, torch.int32),
            seq_lens=t(seq_lens, torch.int32),
            logits_indices=t(logits_idx, torch.int64),
            max_seqlen_q=max_q,
            max_seqlen_k=max(seq_lens),
        )
        return t(input_ids, torch.int64), t(positions, torch.int64), meta, sampled

    def execute(self, scheduled: list[tuple[Sequence, int]]) -> tuple[torch.Tensor | None, list[Sequence]]:
        """Run one step. Returns logits [len(sampled), vocab] for the sequences that get a new token."""
        input_ids, positions, meta, sampled = self.prepare(scheduled)
        is_decode = meta.max_seqlen_q == 1 and len(sampled) == len(scheduled)
        if self.graphs is not None and is_decode and self.graphs.can_run(len(scheduled)):
            return self.graphs.run(input_ids, positions, meta), sampled
        logits = self.model.forward(input_ids, positions, meta, self.kv_caches)
        return (logits if sampled else None), sampled
