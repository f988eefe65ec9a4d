"""PyTorch rotary embedding (vLLM's cos_sin_cache layout), in place on q and k."""

from __future__ import annotations

import torch

from wslm.kernels.step_memo import step_memo


def as_heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """[T, H * D] or [T, H, D] -> a [T, H, D] view of the same memory."""
    if x.dim() == 3:
        return x
    return x.unflatten(-1, (-1, head_dim))


def neox_rotated(x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor, out: torch.Tensor | None = None):
    """x * [cos|cos] + [x2|x1] * [-sin|sin] over x's last dim (all of it rotated): HF's rotate_half in four
    ops, rounded exactly as its x1*cos - x2*sin (each product rounds, then the sum; negating is exact)."""
    swapped = x.unflatten(-1, (2, x.shape[-1] // 2)).flip(-2).flatten(-2)
    return torch.add(x * cos2, swapped * sin2, out=out)


def _rotate(x: torch.Tensor, tables: tuple[torch.Tensor, ...], rot_dim: int, neox: bool) -> None:
    """x [T, H, D] rotated in place over its first rot_dim dims (tables: see _cos_sin)."""
    xr = x if rot_dim == x.shape[-1] else x[..., :rot_dim]
    if neox:  # HF Llama's rotate_half: pairs (i, i + rot_dim/2)
        neox_rotated(xr, tables[2], tables[3], out=xr)
        return
    cos, sin = tables[0], tables[1]  # GPT-J style: pairs (2i, 2i + 1)
    x1, x2 = xr[..., 0::2], xr[..., 1::2]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
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
    tables = step_memo(
        ("rotary", id(cos_sin_cache), q.dtype, is_neox_style),
        (positions, cos_sin_cache),
        lambda: _cos_sin(positions, cos_sin_cache, q.dtype, is_neox_style),
    )
    qk = _side_by_side(q, k)
    for x in (q, k) if qk is None else (qk,):
        if x is None:
            continue
        _rotate(as_heads(x, head_dim), tables, rot_dim, is_neox_style)
    return q, k


def _cos_sin(positions: torch.Tensor, cos_sin_cache: torch.Tensor, dtype: torch.dtype, neox: bool = False):
    """The step's rows: cos, sin [T, 1, rot_dim // 2] and, for neox, [cos|cos], [-sin|sin] [T, 1, rot_dim]."""
    rot_dim = cos_sin_cache.shape[-1]
    cs = cos_sin_cache.index_select(0, positions.reshape(-1).long()).to(dtype)
    cos, sin = cs[:, None, : rot_dim // 2], cs[:, None, rot_dim // 2 :]
    if not neox:
        return cos, sin
    return cos, sin, torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def _side_by_side(q: torch.Tensor, k: torch.Tensor | None) -> torch.Tensor | None:
    """q and k as one [T, (Hq + Hkv) * D] view when they are neighbouring column slices of one buffer
    (the q|k|v output of a fused projection): one rotation instead of two."""
    if k is None or q.dim() != 2 or k.dim() != 2 or q.stride() != k.stride() or q.stride(1) != 1:
        return None
    if q.dtype != k.dtype or k.data_ptr() != q.data_ptr() + q.shape[1] * q.element_size():
        return None
    return q.as_strided((q.shape[0], q.shape[1] + k.shape[1]), q.stride())
