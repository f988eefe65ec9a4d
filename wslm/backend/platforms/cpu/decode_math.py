"""The Llama-shaped decoder layer in torch ops, as the CPU decode back ends compute it from a DecodeLayer
(modeling/layers/decode_spec.py): the eager step (decode_eager.py) runs these functions, the compiled step
(decode_compiled.py) traces them into its graph, so the layer's torch form is written once. Each back end
keeps what differs: where the products' weights live (bound callables, graph buffers) and how the new key and
value meet the paged cache (written in place; put into a gathered copy). The C step (kernels/cpu_layer.c)
is the same math in one C loop."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from wslm.kernels.torch_rotary import neox_rotated

Product = Callable[[torch.Tensor], torch.Tensor]


def attention_in(
    hidden: torch.Tensor, residual: torch.Tensor | None, w_in: torch.Tensor, eps_in: float, qkv: Product,
    q_size: int, kv_size: int, head_dim: int, kv_heads: int, qk_norm: torch.Tensor | None, qk_eps: float | None,
    cos2: torch.Tensor, sin2: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The residual stream with the last block's output added, then the pre-norm, the q|k|v product, the
    per-head q/k norm and rotary: (residual, q|k heads [b, heads + kv_heads, head_dim], v [b, kv_heads,
    head_dim])."""
    residual = hidden if residual is None else hidden + residual
    x = w_in * F.rms_norm(residual, (residual.shape[-1],), None, eps_in)
    out = qkv(x)
    qk = out[:, : q_size + kv_size].unflatten(-1, (-1, head_dim))
    if qk_norm is not None:
        qk = qk_norm * F.rms_norm(qk, (head_dim,), None, qk_eps)
    qk = neox_rotated(qk, cos2, sin2)
    v = out[:, q_size + kv_size :].view(out.shape[0], kv_heads, head_dim)
    return residual, qk, v


def attend(qk: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, heads: int, mask: torch.Tensor,
           scale: float) -> torch.Tensor:
    """Grouped-query attention of the q heads over the cached keys and values ([b, kv_heads, span, head_dim],
    masked past each row's length): [b, heads * head_dim]."""
    b, _, hd = qk.shape
    kvh = keys.shape[1]
    q = qk[:, :heads].reshape(b, kvh, heads // kvh, hd)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
    return out.reshape(b, heads * hd)


def attention_out_and_mlp(attn: torch.Tensor, residual: torch.Tensor, o: Product, w_post: torch.Tensor,
                          eps_post: float, mlp: Product) -> tuple[torch.Tensor, torch.Tensor]:
    """The o product added to the residual stream, the post-norm and the MLP: (MLP output, residual)."""
    residual = o(attn) + residual
    x = w_post * F.rms_norm(residual, (residual.shape[-1],), None, eps_post)
    return mlp(x), residual


def gated_mlp(x: torch.Tensor, gate_up: Product, down: Product) -> torch.Tensor:
    """SiLU(gate) * up, then down."""
    gu = gate_up(x)
    half = gu.shape[-1] // 2
    return down(F.silu(gu[:, :half]) * gu[:, half:])
