"""PyTorch RMSNorm with an optional fused residual add, matching HF LlamaRMSNorm's numerics."""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
    # F.rms_norm without a weight: fp32 statistics, result rounded to x's dtype (bitwise HF's
    # h.to(dtype)) in one fused op instead of seven; the weight multiplies after that rounding, as in HF.
    normed = weight * F.rms_norm(x, (x.shape[-1],), None, eps)
    if normed.dtype != x.dtype:
        normed = normed.to(x.dtype)
    return normed if residual is None else (normed, summed)
