"""Phi-3 / Phi-3.5 / Phi-4-mini / Phi-4: Llama's decoder stored with fused qkv_proj and gate_up_proj.

What else differs is config the shared layers read: longrope scaling (layers/rotary.py), partial rotary
(Phi-4-mini rotates 3/4 of each head; ModelConfig.rotary_dim) and a sliding window on some Phi-3 minis."""

from __future__ import annotations

from wslm.backend.modeling.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    fused_checkpoint = True
