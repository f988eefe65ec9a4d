"""Qwen3 (dense): Llama's decoder with a per-head RMSNorm on q and k before rotary, no qkv bias."""

from __future__ import annotations

from wslm.backend.modeling.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
