"""PyTorch rotary embedding (vLLM's cos_sin_cache layout), in place on q and k."""

from __future__ import annotations

import torch


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
    # HF casts cos/sin to the activations' dtype and rotates in that dtype; so does this.
    cs = cos_sin_cache.index_select(0, positions.reshape(-1).long()).to(q.dtype)
    cos = cs[:, None, : rot_dim // 2]
    sin = cs[:, None, rot_dim // 2 :]
    for x in (q, k):
        if x is None:
            continue
        _rotate(as_heads(x, head_dim), cos, sin, rot_dim, is_neox_style)
    return q, k
