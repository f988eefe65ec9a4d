"""How weights split across tensor-parallel ranks (Megatron-style, as vLLM does):
- column-parallel (q/k/v, gate/up): each rank keeps its heads / its slice of the MLP's inner width;
- row-parallel (o, down): each rank keeps the matching input columns, and the outputs are summed
  (one all-reduce each);
- vocab-parallel (embedding, lm_head): each rank keeps a slice of the vocabulary, padded so it divides.
KV heads are split when there are at least as many as ranks, else replicated (each rank keeps the one its
query heads read)."""

from __future__ import annotations

import torch

from wslm.backend.distributed.parallel_state import (
    get_tp_rank,
    get_tp_size,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from wslm.backend.quant.linear import apply_linear, embedding, head_logits
from wslm.backend.quant.shard import narrow, pad_rows


def local_num_heads(num_heads: int) -> int:
    return num_heads // get_tp_size()


def local_num_kv_heads(num_kv_heads: int) -> int:
    return max(1, num_kv_heads // get_tp_size())


def shard_dim(t, dim: int):
    """This rank's equal slice along dim (column-parallel: dim 0 of a weight; row-parallel: dim 1). t is a
    tensor or a quantized weight, which keeps its format (wslm.backend.quant.shard)."""
    size = get_tp_size()
    if size == 1:
        return t
    per = t.shape[dim] // size
    return narrow(t, dim, get_tp_rank() * per, per)


def shard_heads(t, num_heads: int, head_dim: int):
    """Rows of a q projection (weight or bias): this rank's query heads."""
    size, rank = get_tp_size(), get_tp_rank()
    if size == 1:
        return t
    per = num_heads // size
    return narrow(t, 0, rank * per * head_dim, per * head_dim)


def shard_kv_heads(t, num_kv_heads: int, head_dim: int):
    """Rows of a k or v projection: this rank's KV heads, or the one replicated KV head its queries use."""
    size, rank = get_tp_size(), get_tp_rank()
    if size == 1:
        return t
    if num_kv_heads >= size:
        per = num_kv_heads // size
        first = rank * per
    else:
        per, first = 1, rank * num_kv_heads // size
    return narrow(t, 0, first * head_dim, per * head_dim)


def vocab_shard_size(vocab_size: int) -> int:
    return -(-vocab_size // get_tp_size())


def shard_vocab(t, vocab_size: int):
    """Rows [rank * per, (rank + 1) * per) of an embedding or lm_head, zero-padded past the vocabulary."""
    size, rank = get_tp_size(), get_tp_rank()
    if size == 1:
        return t
    per = vocab_shard_size(vocab_size)
    start = min(rank * per, vocab_size)
    return pad_rows(narrow(t, 0, start, min(per, vocab_size - start)), per)


def vocab_parallel_embedding(ids: torch.Tensor, weight, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Rows of a dense or int8 table (GGUF files, int8/int4 on the fly)."""
    if get_tp_size() == 1:
        return embedding(ids, weight, dtype)  # an int8 table (GGUF) reads out in the model's dtype
    per = weight.shape[0]
    local = ids - get_tp_rank() * per
    outside = (local < 0) | (local >= per)
    out = embedding(local.masked_fill(outside, 0), weight, dtype)
    out.masked_fill_(outside.unsqueeze(-1), 0.0)
    return tensor_model_parallel_all_reduce(out)


def parallel_lm_head(hidden: torch.Tensor, weight: torch.Tensor, vocab_size: int, float32: bool = False
                     ) -> torch.Tensor:
    """Logits over the whole vocabulary on every rank: each computes its slice, then they gather."""
    logits = head_logits(hidden, weight, float32)
    if get_tp_size() == 1:
        return logits
    return tensor_model_parallel_all_gather(logits, dim=-1)[..., :vocab_size]


def row_parallel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """o / down projections: partial sums on each rank, summed by one all-reduce (bias added once)."""
    out = apply_linear(x, weight)
    out = tensor_model_parallel_all_reduce(out)
    return out if bias is None else out + bias
