"""What transformers' GGUF config reader leaves out, read from the file itself, so that a GGUF runs as its
safetensors original does (and as llama.cpp runs it):

- Phi-3 / Phi-4 (`phi3`): partial rotary (`rope.dimension_count`: Phi-4-mini rotates 96 of 128 dims),
  longrope (the `rope_factors_long` / `rope_factors_short` tensors, `rope.scaling.original_context_length`,
  `rope.scaling.attn_factor`: Phi-3.5 and Phi-4-mini) and the sliding window (0 means none: Phi-4).
- Gemma 2 / 3: query_pre_attn_scalar, which no key carries: llama.cpp's rule (hidden / heads for the 27B
  models, else head_dim); Gemma 2's logit softcaps; Gemma 3's linear rope scaling of its global layers.
- Qwen3-MoE / Qwen2-MoE: the experts' width (`expert_feed_forward_length`), the shared expert's, and
  whether top-k weights are renormalised (llama.cpp: Qwen3-MoE yes, Qwen2-MoE no).

Without these, transformers' reader falls back to its config defaults, which differ from the real models."""

from __future__ import annotations

from pathlib import Path

from wslm.backend.quant.gguf_file import GGUFFile

# Whether the top-k routing weights are renormalised, as llama.cpp runs each family (Qwen3-MoE configs say
# norm_topk_prob: true, Qwen1.5/Qwen2-MoE false; transformers' default is false for both).
_MOE_NORM = {"qwen3moe": True, "qwen2moe": False}
# Layer counts of the 27B models, whose query scale is 1/sqrt(hidden / heads) (llama.cpp decides the same way).
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def complete_config(hf_config, gguf_path: str | Path) -> None:
    """Fill in hf_config (read by transformers from gguf_path) with what only the file's own keys say."""
    from wslm.backend.modeling import gguf_architecture

    if gguf_architecture(getattr(hf_config, "model_type", "")) not in ("phi3", *_GEMMA_27B_LAYERS, *_MOE_NORM):
        return  # nothing to add
    header = GGUFFile(gguf_path)
    try:
        arch = header.values.get("general.architecture")
        if arch == "phi3":
            _phi3(hf_config, header)
        elif arch in _GEMMA_27B_LAYERS:
            _gemma(hf_config, header, arch)
        elif arch in _MOE_NORM:
            _moe(hf_config, header, arch)
    finally:
        header.close()


def _rope_dict(hf_config) -> dict:
    params = getattr(hf_config, "rope_parameters", None)
    return dict(params) if isinstance(params, dict) else {}


def _phi3(cfg, header: GGUFFile) -> None:
    get = header.values.get
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    rope = _rope_dict(cfg)
    rope.setdefault("rope_theta", getattr(cfg, "rope_theta", None) or 10000.0)
    dims = get("phi3.rope.dimension_count")
    if dims and int(dims) < head_dim:
        rope["partial_rotary_factor"] = int(dims) / head_dim
        cfg.partial_rotary_factor = int(dims) / head_dim
    window = get("phi3.attention.sliding_window")
    if window is not None:
        cfg.sliding_window = int(window) or None
    long, short = header.f32_tensor("rope_factors_long.weight"), header.f32_tensor("rope_factors_short.weight")
    original = get("phi3.rope.scaling.original_context_length")
    if long and short and original:
        rope.update(rope_type="longrope", long_factor=long, short_factor=short,
                    original_max_position_embeddings=int(original))  # fmt: skip
        attn = get("phi3.rope.scaling.attn_factor")
        if attn is not None:
            rope["attention_factor"] = float(attn)
        cfg.original_max_position_embeddings = int(original)
    cfg.rope_parameters = rope


def _gemma(cfg, header: GGUFFile, arch: str) -> None:
    get = header.values.get
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    big = cfg.num_hidden_layers == _GEMMA_27B_LAYERS[arch]
    cfg.query_pre_attn_scalar = cfg.hidden_size // cfg.num_attention_heads if big else head_dim
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        value = get(f"{arch}.{key}")
        if value is not None:
            setattr(cfg, key, float(value))
    if arch == "gemma3" and str(get("gemma3.rope.scaling.type") or "").lower() == "linear":
        factor = float(get("gemma3.rope.scaling.factor") or 1.0)
        rope = _rope_dict(cfg)
        full = dict(rope.get("full_attention") or {})
        full.setdefault("rope_theta", getattr(cfg, "rope_theta", None) or 1000000.0)
        full.update(rope_type="linear", factor=factor)
        rope["full_attention"] = full
        rope.setdefault("sliding_attention", {"rope_type": "default", "rope_theta": 10000.0})
        cfg.rope_parameters = rope


def _moe(cfg, header: GGUFFile, arch: str) -> None:
    get = header.values.get
    inner = get(f"{arch}.expert_feed_forward_length")
    if inner:
        cfg.moe_intermediate_size = int(inner)
    shared = get(f"{arch}.expert_shared_feed_forward_length")
    if shared:
        cfg.shared_expert_intermediate_size = int(shared)
    norm = get(f"{arch}.expert_weights_norm")
    cfg.norm_topk_prob = bool(norm) if norm is not None else _MOE_NORM[arch]
