"""PyTorch RMSNorm with an optional fused residual add, matching HF LlamaRMSNorm's numerics."""

from __future__ import annotations

import torch


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """See wslm.kernels.rms_norm."""
    if residual is not None:
        # HF adds in the model dtype, then normalises the rounded sum.
        x = x + residual
        summed = x
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    normed = (weight * h.to(dtype)).to(dtype)
    return normed if residual is None else (normed, summed)
