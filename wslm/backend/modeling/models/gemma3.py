"""Gemma 2 and Gemma 3 (text; Gemma3ForConditionalGeneration checkpoints load their language model).

Differences from Llama, all here or in config the shared layers read:
- RMSNorm scales by (1 + w), and each sub-block has a norm before and after it (four per layer);
- the MLP uses gelu-tanh; embeddings are scaled by sqrt(hidden_size) in the model dtype;
- attention scale is query_pre_attn_scalar ** -0.5;
- Gemma 2 caps attention scores (attn_logit_softcapping) and the final logits (final_logit_softcapping);
- layers alternate sliding-window and full attention (config layer_types); Gemma 3 gives the sliding
  layers their own rope base (rope_local_base_freq) and adds per-head q/k norms."""

from __future__ import annotations

import torch

from wslm.backend.modeling.layers.norm import GemmaRMSNorm
from wslm.backend.modeling.layers.rotary import get_rope
from wslm.backend.modeling.models.llama import LlamaDecoderLayer, LlamaForCausalLM, Loaders


class GemmaDecoderLayer(LlamaDecoderLayer):
    def __init__(self, model, layer_idx: int) -> None:
        super().__init__(model, layer_idx)
        cfg = model.cfg
        self.pre_feedforward_layernorm = GemmaRMSNorm(
            cfg.rms_norm_eps, model.dtype, model.device, model.backend
        )
        self.post_feedforward_layernorm = GemmaRMSNorm(
            cfg.rms_norm_eps, model.dtype, model.device, model.backend
        )

    def loaders(self, prefix: str, fused: bool = False) -> Loaders:
        return {
            **super().loaders(prefix, fused),
            f"{prefix}.pre_feedforward_layernorm.weight": self.pre_feedforward_layernorm.load,
            f"{prefix}.post_feedforward_layernorm.weight": self.post_feedforward_layernorm.load,
        }

    def __call__(self, positions, hidden, residual, kv_cache, meta):
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.post_attention_layernorm(self.self_attn(positions, hidden, kv_cache, meta))
        # The residual add of the attention block is fused into the MLP's pre-norm.
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        return self.post_feedforward_layernorm(self.mlp(hidden)), residual


class Gemma2ForCausalLM(LlamaForCausalLM):
    layer_cls = GemmaDecoderLayer
    norm_cls = GemmaRMSNorm

    @classmethod
    def config_overrides(cls, hf_config) -> dict:
        from wslm.backend.modeling.config import rope_settings

        extra = {
            "query_pre_attn_scalar": getattr(hf_config, "query_pre_attn_scalar", None),
            "attn_logit_softcapping": getattr(hf_config, "attn_logit_softcapping", None),
            "final_logit_softcapping": getattr(hf_config, "final_logit_softcapping", None),
        }
        # Gemma 3's sliding layers rotate with their own base: transformers 5 keeps it under
        # rope_parameters["sliding_attention"], 4.x as rope_local_base_freq.
        params = getattr(hf_config, "rope_parameters", None) or {}
        local = params.get("sliding_attention") if isinstance(params.get("sliding_attention"), dict) else None
        if local is not None:
            extra["local_rope"] = rope_settings(local)
        elif getattr(hf_config, "rope_local_base_freq", None):
            extra["local_rope"] = (float(hf_config.rope_local_base_freq), None)
        return {"extra": extra, "tie_word_embeddings": bool(getattr(hf_config, "tie_word_embeddings", True))}

    def init_extra(self) -> None:
        extra = self.cfg.extra
        self.attn_logit_softcap = extra.get("attn_logit_softcapping") or None
        self.final_logit_softcap = extra.get("final_logit_softcapping") or None
        self.embed_scale = torch.tensor(self.cfg.hidden_size**0.5, dtype=self.dtype, device=self.device)

    def attention_scale(self) -> float:
        scalar = self.cfg.extra.get("query_pre_attn_scalar") or self.cfg.head_dim
        return float(scalar) ** -0.5

    def rope_for_layer(self, layer_idx: int):
        local = self.cfg.extra.get("local_rope")
        if local is None or self.cfg.layer_sliding_window(layer_idx) is None:
            return super().rope_for_layer(layer_idx)
        cfg = self.cfg
        theta, scaling = local
        return get_rope(
            cfg.head_dim, cfg.rotary_dim, max(cfg.max_position_embeddings, cfg.max_model_len or 0), theta, scaling,
            self.device, model_max_positions=cfg.max_position_embeddings, backend=self.backend,
            tables=self._rope_tables,
        )  # fmt: skip

    def checkpoint_name(self, name: str) -> str | None:
        # Gemma3ForConditionalGeneration: the language model under one of two prefixes (checkpoints saved
        # by transformers 4.x / 5.x); the vision tower and projector are skipped.
        for old, new in (
            ("language_model.model.", "model."),
            ("model.language_model.", "model."),
            ("language_model.lm_head.", "lm_head."),
        ):
            if name.startswith(old):
                return new + name[len(old) :]
        if name.startswith(("vision_tower.", "multi_modal_projector.", "model.vision_tower.")):
            return None
        if name.startswith("model.multi_modal_projector."):
            return None
        return super().checkpoint_name(name)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids) * self.embed_scale

    def compute_logits(self, hidden: torch.Tensor, float32: bool = False) -> torch.Tensor:
        logits = self.lm_head(hidden, float32).float()
        cap = self.final_logit_softcap
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    qk_norm = True


Gemma3ForConditionalGeneration = Gemma3ForCausalLM
