"""PyTorch reference of the batched LoRA delta (triton_lora.py beside it): every token row adds its own
adapter's scale * (x @ A^T) @ B^T, read from the slot buffers the worker keeps for the resident adapters.

a: [slots, R, K] (each slot's A, zero rows past its rank), b: [slots, N, R] (B with the scale folded in,
zero columns past the rank), token_slot: [T] int32, the slot of each row of x or -1 (the base alone)."""

from __future__ import annotations

import torch


def lora_delta(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, token_slot: torch.Tensor,
               out: torch.Tensor) -> torch.Tensor:
    """out += delta, in place (rows with slot -1 untouched); the products in float32. Returns out."""
    slots = token_slot.long()
    rows = (slots >= 0).nonzero().squeeze(1)
    if rows.numel() == 0:
        return out
    s = slots.index_select(0, rows)
    h = torch.bmm(a.index_select(0, s).float(), x.index_select(0, rows).float().unsqueeze(-1))  # [n, R, 1]
    delta = torch.bmm(b.index_select(0, s).float(), h).squeeze(-1)  # [n, N]
    out.index_add_(0, rows, delta.to(out.dtype))
    return out
