"""PyTorch mixture-of-experts: the engine's CPU path and the reference for the Triton kernel.

Experts run grouped: the (token, slot) pairs are sorted by expert, and each expert that received tokens
does one gate|up matmul and one down matmul over all of its tokens (no per-token loop, no dense
all-experts compute). Routing (softmax top-k) lives with the layer; this takes its result.

w13 / w2 are stacked dense tensors, or lists of one weight per expert: a dense [rows, cols] tensor or a
quantized weight with an `apply(x)` (wslm.backend.quant's Int4Weight / Int8Weight), so quantized experts
run their own kernels (int4/int8 weight-only matmuls) on just their tokens."""

from __future__ import annotations

from collections.abc import Callable

import torch


def _matmul(x: torch.Tensor, w) -> torch.Tensor:
    return x @ w.t() if isinstance(w, torch.Tensor) else w.apply(x)


def fused_moe(
    hidden: torch.Tensor,
    w13,
    w2,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    act_and_mul: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """See wslm.kernels.fused_moe."""
    num_tokens, top_k = topk_ids.shape
    if num_tokens == 0:
        return torch.zeros_like(hidden)
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # (token, slot) pairs grouped by expert
    counts = torch.bincount(flat, minlength=len(w13)).tolist()
    tokens = order // top_k
    weights = topk_weights.reshape(-1)[order].to(hidden.dtype)
    # Each pair's output lands in its own row, then a token's top_k rows are summed: index_add_ on CPU
    # (scatter_add) costs ~100x a matmul of this size.
    per_slot = torch.empty(num_tokens * top_k, hidden.shape[1], dtype=hidden.dtype, device=hidden.device)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        end = start + count
        x = hidden.index_select(0, tokens[start:end])
        y = _matmul(act_and_mul(_matmul(x, w13[expert])), w2[expert])
        # Rounded to the model dtype before the routing weight, as HF's experts loop does.
        per_slot[order[start:end]] = y * weights[start:end, None]
        start = end
    return per_slot.view(num_tokens, top_k, -1).sum(dim=1)
