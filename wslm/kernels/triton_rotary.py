"""Triton rotary embedding, in place: one program per token rotates all its query and key heads."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wslm.kernels import configs
from wslm.kernels.torch_rotary import as_heads


@triton.jit
def _rotate_heads(x_ptr, stride_h, num_heads, cos, sin, offs_h, offs_i, half, IS_NEOX: tl.constexpr):
    """Rotates x[h, pair i] for heads offs_h (< num_heads) and pair indices offs_i (< half) in place."""
    mask = (offs_h[:, None] < num_heads) & (offs_i[None, :] < half)
    base = x_ptr + offs_h[:, None] * stride_h
    if IS_NEOX:
        p1 = base + offs_i[None, :]
        p2 = p1 + half
    else:
        p1 = base + 2 * offs_i[None, :]
        p2 = p1 + 1
    x1 = tl.load(p1, mask=mask, other=0.0)
    x2 = tl.load(p2, mask=mask, other=0.0)
    # cos/sin rounded to x's dtype first, as HF does before rotating.
    c = cos.to(x1.dtype).to(tl.float32)[None, :]
    s = sin.to(x1.dtype).to(tl.float32)[None, :]
    a = x1.to(tl.float32)
    b = x2.to(tl.float32)
    tl.store(p1, (a * c - b * s).to(x1.dtype), mask=mask)
    tl.store(p2, (b * c + a * s).to(x1.dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    pos_ptr, q_ptr, k_ptr, cache_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_c,
    num_q_heads, num_k_heads, half,
    HAS_K: tl.constexpr, IS_NEOX: tl.constexpr, Q_HEADS_PAD: tl.constexpr, K_HEADS_PAD: tl.constexpr,
    HALF_PAD: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    offs_i = tl.arange(0, HALF_PAD)
    cos = tl.load(cache_ptr + pos * stride_c + offs_i, mask=offs_i < half, other=0.0)
    sin = tl.load(cache_ptr + pos * stride_c + half + offs_i, mask=offs_i < half, other=0.0)
    _rotate_heads(q_ptr + tok * stride_qt, stride_qh, num_q_heads, cos, sin, tl.arange(0, Q_HEADS_PAD),
                  offs_i, half, IS_NEOX)
    if HAS_K:
        _rotate_heads(k_ptr + tok * stride_kt, stride_kh, num_k_heads, cos, sin,
                      tl.arange(0, K_HEADS_PAD), offs_i, half, IS_NEOX)


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    head_dim: int | None = None,
    is_neox_style: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """See wslm.kernels.rotary_embedding."""
    rot_dim = cos_sin_cache.shape[-1]
    head_dim = head_dim or (q.shape[-1] if q.dim() == 3 else rot_dim)
    if rot_dim > head_dim or rot_dim % 2:
        raise ValueError(f"rotary_embedding: rot_dim {rot_dim} must be even and at most head_dim {head_dim}")
    qh = as_heads(q, head_dim)
    kh = as_heads(k, head_dim) if k is not None else qh
    for name, t in (("q", qh), ("k", kh)):
        if t.stride(-1) != 1:
            raise ValueError(f"rotary_embedding (triton): the head_dim axis of {name} must be contiguous")
    cache = cos_sin_cache if cos_sin_cache.stride(-1) == 1 else cos_sin_cache.contiguous()
    pos = positions.reshape(-1)
    if not pos.is_contiguous():
        pos = pos.contiguous()
    num_tokens = qh.shape[0]
    if num_tokens:
        q_pad, k_pad, half_pad, warps = configs.rotary_config(qh.shape[1], kh.shape[1], rot_dim)
        _rotary_kernel[(num_tokens,)](
            pos, qh, kh, cache, qh.stride(0), qh.stride(1), kh.stride(0), kh.stride(1), cache.stride(0),
            qh.shape[1], kh.shape[1], rot_dim // 2,
            HAS_K=k is not None, IS_NEOX=is_neox_style,
            Q_HEADS_PAD=q_pad, K_HEADS_PAD=k_pad, HALF_PAD=half_pad, num_warps=warps,
        )
    return q, k
