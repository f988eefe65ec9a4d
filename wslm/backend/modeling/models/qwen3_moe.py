"""Qwen3-MoE and Qwen2-MoE: Llama-style attention (Qwen3: per-head q/k norms; Qwen2: qkv bias) with a
sparse MoE block in place of the MLP (layers/moe.py). Layers listed in mlp_only_layers, or off the
decoder_sparse_step beat, keep a dense MLP. Qwen2-MoE adds a shared expert whose output is scaled by
sigmoid(shared_expert_gate(x)) and added to the routed experts' sum."""

from __future__ import annotations

import dataclasses
from functools import partial

import torch

from wslm.backend.distributed.parallel_state import tensor_model_parallel_all_reduce
from wslm.backend.modeling.layers.decode_spec import DecodeLayer
from wslm.backend.modeling.layers.linear import ReplicatedLinear
from wslm.backend.modeling.layers.moe import FusedMoE
from wslm.backend.modeling.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP, Loaders


class SparseMoeBlock:
    """Under tensor parallelism the routed experts and the shared expert each leave a partial sum on every
    rank (both split along their inner width); the block adds them and all-reduces once."""

    def __init__(self, model) -> None:
        cfg, extra = model.cfg, model.cfg.extra
        shared = extra.get("shared_expert_intermediate_size")
        self.experts = FusedMoE(
            extra["num_experts"], extra["num_experts_per_tok"], cfg.hidden_size, extra["moe_intermediate_size"],
            norm_topk_prob=bool(extra["norm_topk_prob"]), hidden_act=cfg.hidden_act, dtype=model.dtype,
            device=model.device, backend=model.backend, reduce_results=not shared, quantization=cfg.quantization,
        )  # fmt: skip
        self.shared_expert = self.shared_expert_gate = None
        if shared:
            self.shared_expert = LlamaMLP(model, shared, reduce_results=False)
            self.shared_expert_gate = ReplicatedLinear(cfg.hidden_size, [1], dtype=model.dtype, device=model.device)

    def loaders(self, prefix: str, fused: bool = False) -> Loaders:
        out = self.experts.loaders(prefix)
        if self.shared_expert is not None:
            out.update(self.shared_expert.loaders(f"{prefix}.shared_expert"))
            out[f"{prefix}.shared_expert_gate.weight"] = partial(self.shared_expert_gate.load, "weight")
        return out

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.experts(x)
        if self.shared_expert is not None:
            # The gate is replicated (x is whole on every rank), so scaling each rank's partial sum by it
            # and summing equals scaling the sum.
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
            out = tensor_model_parallel_all_reduce(out)
        return out


class Qwen3MoeDecoderLayer(LlamaDecoderLayer):
    def __init__(self, model, layer_idx: int) -> None:
        super().__init__(model, layer_idx)
        if model.is_sparse_layer(layer_idx):
            self.mlp = SparseMoeBlock(model)

    def decode_spec(self) -> DecodeLayer | str:
        """The Llama layer's spec; a block of routed experts alone (no shared expert) is named as such, so a
        back end may compute it itself (layers/decode_spec.py)."""
        spec = super().decode_spec()
        mlp = self.mlp
        if isinstance(spec, str) or not isinstance(mlp, SparseMoeBlock) or mlp.shared_expert is not None:
            return spec
        return dataclasses.replace(spec, experts=mlp.experts)


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    layer_cls = Qwen3MoeDecoderLayer
    qk_norm = True

    @classmethod
    def config_overrides(cls, hf_config) -> dict:
        extra = {
            "num_experts": int(hf_config.num_experts),
            "num_experts_per_tok": int(hf_config.num_experts_per_tok),
            "moe_intermediate_size": int(hf_config.moe_intermediate_size),
            "norm_topk_prob": bool(getattr(hf_config, "norm_topk_prob", False)),
            "decoder_sparse_step": int(getattr(hf_config, "decoder_sparse_step", 1) or 1),
            "mlp_only_layers": list(getattr(hf_config, "mlp_only_layers", None) or []),
            "shared_expert_intermediate_size": getattr(hf_config, "shared_expert_intermediate_size", None),
        }
        return {"extra": extra}

    def is_sparse_layer(self, layer_idx: int) -> bool:
        extra = self.cfg.extra
        if layer_idx in extra["mlp_only_layers"] or extra["num_experts"] <= 0:
            return False
        return (layer_idx + 1) % extra["decoder_sparse_step"] == 0


class Qwen2MoeForCausalLM(Qwen3MoeForCausalLM):
    qk_norm = False

    @classmethod
    def config_overrides(cls, hf_config) -> dict:
        out = super().config_overrides(hf_config)
        out["qkv_bias"] = bool(getattr(hf_config, "qkv_bias", True))
        return out
