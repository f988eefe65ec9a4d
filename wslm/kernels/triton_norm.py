"""Triton RMSNorm, optionally fused with the residual add: one program per row, the row in registers.

Numerics follow HF LlamaRMSNorm: the residual sum is rounded to the activations' dtype, statistics are in
fp32, the normalised row is rounded to that dtype before the weight multiplies it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wslm.kernels import configs


@triton.jit
def _rms_norm_kernel(
    x_ptr, r_ptr, w_ptr, out_ptr, sum_ptr,
    stride_x, stride_r, stride_o, stride_s,
    n_cols, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * stride_s + cols, x, mask=mask)
    h = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, 0) / n_cols + eps)
    normed = (h * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """See wslm.kernels.rms_norm."""
    n = x.shape[-1]
    if weight.shape != (n,):
        raise ValueError(f"rms_norm: weight {tuple(weight.shape)} does not match hidden size {n}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"rms_norm: residual {tuple(residual.shape)} != x {tuple(x.shape)}")
    x2 = _rows(x)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    summed = torch.empty_like(out) if residual is not None else out
    r2 = _rows(residual) if residual is not None else x2
    if x2.shape[0]:
        block, warps = configs.rms_norm_config(n)
        _rms_norm_kernel[(x2.shape[0],)](
            x2, r2, weight.contiguous(), out, summed,
            x2.stride(0), r2.stride(0), out.stride(0), summed.stride(0), n, float(eps),
            HAS_RESIDUAL=residual is not None, BLOCK=block,
            num_warps=warps,
        )
    out = out.view(x.shape)
    return out if residual is None else (out, summed.view(x.shape))
