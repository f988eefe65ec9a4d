"""PyTorch rotary embedding (vLLM's cos_sin_cache layout), in place on q and k."""

from __future__ import annotations

import torch

from wslm.kernels.step_memo import step_memo


def as_heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """[T, H * D] or [T, H, D] -> a [T, H, D] view of the same memory."""
    if x.dim() == 3:
        return x
    return x.unflatten(-1, (-1, head_dim))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot_dim: int, neox: bool) -> None:
    """x [T, H, D] rotated in place over its first rot_dim dims; cos/sin [T, 1, rot_dim // 2]."""
    xr = x[..., :rot_dim]
    if neox:  # HF Llama's rotate_half: pairs (i, i + rot_dim/2)
        x1, x2 = xr[..., : rot_dim // 2], xr[..., rot_dim // 2 :]
    else:  # GPT-J style: pairs (2i, 2i + 1)
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    if neox:
        xr.copy_(torch.cat((o1, o2), dim=-1))
    else:
        xr.copy_(torch.stack((o1, o2), dim=-1).flatten(-2))


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
    # HF casts cos/sin to the activations' dtype and rotates in that dtype; so does this. The same rows
    # serve every layer of a step (step_memo.py).
    cos, sin = step_memo(
        ("rotary", id(cos_sin_cache), q.dtype),
        (positions, cos_sin_cache),
        lambda: _cos_sin(positions, cos_sin_cache, q.dtype),
    )
    qk = _side_by_side(q, k)
    for x in (q, k) if qk is None else (qk,):
        if x is None:
            continue
        _rotate(as_heads(x, head_dim), cos, sin, rot_dim, is_neox_style)
    return q, k


def _cos_sin(positions: torch.Tensor, cos_sin_cache: torch.Tensor, dtype: torch.dtype):
    rot_dim = cos_sin_cache.shape[-1]
    cs = cos_sin_cache.index_select(0, positions.reshape(-1).long()).to(dtype)
    return cs[:, None, : rot_dim // 2], cs[:, None, rot_dim // 2 :]


def _side_by_side(q: torch.Tensor, k: torch.Tensor | None) -> torch.Tensor | None:
    """q and k as one [T, (Hq + Hkv) * D] view when they are neighbouring column slices of one buffer
    (the q|k|v output of a fused projection): one rotation instead of two."""
    if k is None or q.dim() != 2 or k.dim() != 2 or q.stride() != k.stride() or q.stride(1) != 1:
        return None
    if q.dtype != k.dtype or k.data_ptr() != q.data_ptr() + q.shape[1] * q.element_size():
        return None
    return q.as_strided((q.shape[0], q.shape[1] + k.shape[1]), q.stride())
