"""What a model family tells the CPU decode back ends (platforms/cpu) about one decoder layer.

The back ends compute a Llama-shaped layer in fewer ops (eager), as one graph (compiled) or in one C call
(native): pre-norm attention with neox rotary over the paged KV cache, then a gated MLP, each added to the
residual stream. Whether a layer is that shape is the family's knowledge, not the platform's: each layer
class answers `decode_spec()` with a DecodeLayer, or with a string saying why its math is another
(Gemma's extra norms, sinks, a sliding window), and the back ends read only these fields. The model answers
`decode_layers()` (every layer's DecodeLayer) and `decode_ends()` (DecodeEnds: the token table, final norm
and head, for a back end that freezes the whole step), each with a reason where its math is another."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DecodeLayer:
    source: object  # the layer itself (its weights may be replaced: ask it again then)
    input_norm: object  # RMS norms: .weight [d] (Gemma's 1 + w folded at load), .eps
    post_norm: object
    # linear layers: .weight (a tensor or a quantized weight: quant/kernel.py describes either), .bias, and
    # .bias_after_product (the bias added to the finished product, as a row-parallel layer adds it)
    qkv_proj: object
    o_proj: object
    q_norm: object | None  # per-head RMS norms before rotary (HeadRMSNorm: .weight, .norm.eps), or None
    k_norm: object | None
    cos_sin_cache: torch.Tensor  # neox rotary over the whole head, shared by every layer
    heads: int
    kv_heads: int
    head_dim: int
    q_size: int
    kv_size: int
    scale: float
    gate_up_proj: object | None  # a SiLU-gated MLP's two linears, or None:
    down_proj: object | None
    mlp: Callable[[torch.Tensor], torch.Tensor] | None  # then the MLP called as it is (experts)
    # When that MLP is a plain sparse mixture of experts (no shared expert): its layers/moe.FusedMoE, whose
    # router (.gate), per-expert weights (.w13 gate|up, .w2 down), .top_k, .norm_topk_prob and .act_and_mul
    # a back end may compute itself; None otherwise.
    experts: object | None = None


@dataclass(frozen=True)
class DecodeEnds:
    """The model around its layers, for a back end that freezes the whole step (the compiled graph): embed()
    is a lookup in embed_table, and compute_logits(norm(h)) is final_norm then the head's product."""

    embed_table: object  # the token table: a tensor or a quantized weight (its rows as they are)
    final_norm: object  # RMS norm: .weight, .eps
    head: object  # the LM head's weight (a tensor or a quantized weight)
