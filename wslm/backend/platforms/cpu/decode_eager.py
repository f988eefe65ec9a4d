"""A decode step on CPU with as few ops as the math needs, for Llama-shaped models (Llama, SmolLM,
Mistral without a window, Qwen2, Qwen3 and their MoE variants, Phi-3 with full rotary).

Why a second path: on CPU every op costs microseconds of dispatch, and in a decode step each layer's
weights stream through the core's L2 between the small ops, evicting the interpreter's and the
dispatcher's working set, so each small op runs cold (an `add` of 576 values: 1.2 us warm, ~10 us after
the weights of one layer went by). The general path (model.forward) spends ~80 ops and a dozen Python
calls per layer on wrappers, dispatch, per-call checks and in-place rotary; this one binds every
layer's tensors and kernels once and runs ~20 ops per layer: the demo model's decode forward goes from
~16.5 to ~13 ms on one core. It computes exactly what the general path does, op for op and bit for bit
(tests/test_cpu_decode.py compares logits and the KV pool), so anything it does not cover (prefill,
sliding windows, soft caps, sinks, partial rotary, fp8 KV, tensor parallelism, other layer types) runs
the general path. What each layer computes, it learns from the model family (`model.decode_layers()`,
modeling/layers/decode_spec.py, through decode_specs.py), never from the layers' types, and what each
weight's product is from its kernel description (quant/kernel.py). WSLM_CPU_FAST_DECODE=0 turns it off
(with the other CPU decode back ends)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F

from wslm.backend.modeling.layers.attention import AttentionMetadata
from wslm.backend.modeling.layers.decode_spec import DecodeLayer
from wslm.backend.platforms.cpu.decode_math import attend, attention_in, attention_out_and_mlp, gated_mlp
from wslm.backend.platforms.cpu.decode_specs import (
    ENV_VAR,
    bias_after,
    decode_specs,
    kernel_of,
    qk_norm_weight,
)
from wslm.kernels.torch_paged_attention import _decode_blocks
from wslm.kernels.torch_rotary import _cos_sin

logger = logging.getLogger(__name__)
__all__ = ["ENV_VAR", "CpuDecodePath", "why_not"]


def _linear_fn(layer, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """x -> layer(x) for activations x of dtype, with the per-call format checks done once (tensor
    parallelism is off here): the product the weight's kernel description names (quant/kernel.py)."""
    w, b = layer.weight, layer.bias
    if isinstance(w, torch.Tensor):
        if bias_after(layer):
            return lambda x: F.linear(x, w) + b  # added after the (would-be) sum, rounded as the layer does
        return lambda x: F.linear(x, w, b)
    k = kernel_of(layer)
    if isinstance(k, str) or k.mm is None:
        return layer  # any other format: its own call
    mm, rows, kd = k.mm, k.mm_rows, k.dtype  # the kernel apply picks for fewer rows than `rows`
    if kd is not None and dtype != kd:  # a float32 engine over bf16 kernels (CPUs without bf16): as apply does
        if b is None:
            return lambda x: mm(x.to(kd)).to(dtype) if x.shape[0] < rows else w.apply(x)
        return lambda x: mm(x.to(kd)).to(dtype) + b if x.shape[0] < rows else w.apply(x, b)
    if b is None:
        return lambda x: mm(x) if x.shape[0] < rows else w.apply(x)
    return lambda x: mm(x) + b if x.shape[0] < rows else w.apply(x, b)


def why_not(model, kv_pool: torch.Tensor) -> str | None:
    """None when the fast path computes this model's decode steps exactly; else the reason it cannot."""
    specs = decode_specs(model, kv_pool)
    return specs if isinstance(specs, str) else None


class _Layer:
    __slots__ = ("w_in", "w_post", "eps_in", "eps_post", "qkv", "o", "mlp", "qk_norm_w", "qk_eps", "q_size", "kv_size", "heads", "kv_heads", "head_dim", "scale")  # fmt: skip

    def __init__(self, spec: DecodeLayer) -> None:
        self.w_in, self.w_post = spec.input_norm.weight, spec.post_norm.weight
        self.eps_in, self.eps_post = spec.input_norm.eps, spec.post_norm.eps
        dtype = self.w_in.dtype  # the model's
        self.qkv, self.o = _linear_fn(spec.qkv_proj, dtype), _linear_fn(spec.o_proj, dtype)
        self.q_size, self.kv_size, self.head_dim = spec.q_size, spec.kv_size, spec.head_dim
        self.heads, self.kv_heads, self.scale = spec.heads, spec.kv_heads, spec.scale
        self.qk_norm_w = qk_norm_weight(spec)
        self.qk_eps = None if spec.q_norm is None else spec.q_norm.norm.eps
        self.mlp = spec.mlp  # an MoE block as it is, or the gated MLP over the bound products
        if spec.mlp is None:
            gate_up, down = _linear_fn(spec.gate_up_proj, dtype), _linear_fn(spec.down_proj, dtype)
            self.mlp = lambda x: gated_mlp(x, gate_up, down)


class CpuDecodePath:
    def __init__(self, model, kv_pool: torch.Tensor) -> None:
        self.model = model
        self.kv_pool = kv_pool  # [layers, k|v, blocks, block_size, kv_heads, head_dim]
        specs = decode_specs(model, kv_pool)
        assert not isinstance(specs, str), specs  # build() asked first
        self.layers = [_Layer(spec) for spec in specs]
        self.table = specs[0].cos_sin_cache
        self.block_size = kv_pool.shape[3]
        # Per layer: [k|v, blocks, block_size, ...] to gather whole blocks, [k|v, slots, ...] to write tokens.
        self.pools = [
            (kv_pool[i], kv_pool[i].view(2, -1, *kv_pool.shape[4:])) for i in range(kv_pool.shape[0])
        ]
        self.steps = 0

    @classmethod
    def build(cls, model, kv_pool: torch.Tensor) -> CpuDecodePath | None:
        reason = why_not(model, kv_pool)
        if reason is not None:
            logger.debug("CPU fast decode path off: %s", reason)
            return None
        return cls(model, kv_pool)

    def rebind(self) -> None:
        """Bind the layers' weights again (ModelRunner.weights_updated: they were replaced after loading)."""
        specs = self.model.decode_layers()
        assert not isinstance(specs, str), specs  # the same model: only its weights were replaced
        self.layers = [_Layer(spec) for spec in specs]

    @torch.inference_mode()
    def run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor | None:
        """Logits [B, vocab] (fp32) of a pure decode step (one new token per sequence, every one sampled),
        or None when this step has something the fast path leaves to the general one (a padding slot)."""
        slots = meta.slot_mapping
        if not bool((slots >= 0).all()):
            return None
        model, dtype, bs = self.model, self.model.dtype, self.block_size
        b = input_ids.shape[0]
        cos2, sin2 = _cos_sin(positions, self.table, dtype, True)[2:]
        blocks, mask = _decode_blocks(meta.block_tables, meta.seq_lens, meta.max_seqlen_k, bs, None)
        span = blocks.shape[0] // b * bs  # keys each row reads (masked past its length)
        hidden = model.embed(input_ids)
        residual = None
        for layer, (pool, pool_slots) in zip(self.layers, self.pools):
            residual, qk, v = attention_in(
                hidden, residual, layer.w_in, layer.eps_in, layer.qkv, layer.q_size, layer.kv_size, layer.head_dim,
                layer.kv_heads, layer.qk_norm_w, layer.qk_eps, cos2, sin2,
            )  # fmt: skip
            pool_slots[0].index_copy_(0, slots, qk[:, layer.heads :])
            pool_slots[1].index_copy_(0, slots, v)
            kv = pool.index_select(1, blocks).view(2, b, span, layer.kv_heads, layer.head_dim).transpose(2, 3)
            out = attend(qk, kv[0], kv[1], layer.heads, mask, layer.scale)  # both caches gathered in one op
            hidden, residual = attention_out_and_mlp(out, residual, layer.o, layer.w_post, layer.eps_post, layer.mlp)
        self.steps += 1
        return model.compute_logits(model.norm(hidden + residual))
