"""What transformers' GGUF config reader leaves out, read from the file itself, so that a GGUF runs as its
safetensors original does (and as llama.cpp runs it):

- Phi-3 / Phi-4 (`phi3`): partial rotary (`rope.dimension_count`: Phi-4-mini rotates 96 of 128 dims),
  longrope (the `rope_factors_long` / `rope_factors_short` tensors, `rope.scaling.original_context_length`,
  `rope.scaling.attn_factor`: Phi-3.5 and Phi-4-mini) and the sliding window (0 means none: Phi-4).
- Gemma 2 / 3: query_pre_attn_scalar, which no key carries: llama.cpp's rule (hidden / heads for the 27B
  models, else head_dim); Gemma 2's logit softcaps; Gemma 3's linear rope scaling of its global layers.

Without these, transformers' reader falls back to its config defaults, which differ from the real models."""

from __future__ import annotations

from pathlib import Path

# Layer counts of the 27B models, whose query scale is 1/sqrt(hidden / heads) (llama.cpp decides the same way).
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def _value(reader, key: str):
    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    try:
        return field.contents()
    except Exception:  # a malformed optional key: keep transformers' reading
        return None


def _tensor(reader, name: str) -> list[float] | None:
    for t in reader.tensors:
        if t.name == name:
            return [float(x) for x in t.data.reshape(-1)]
    return None


def complete_config(hf_config, gguf_path: str | Path) -> None:
    """Fill in hf_config (read by transformers from gguf_path) with what only the file's own keys say."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path), "r")
    arch = _value(reader, "general.architecture")
    if arch == "phi3":
        _phi3(hf_config, reader)
    elif arch in _GEMMA_27B_LAYERS:
        _gemma(hf_config, reader, arch)


def _rope_dict(hf_config) -> dict:
    params = getattr(hf_config, "rope_parameters", None)
    return dict(params) if isinstance(params, dict) else {}


def _phi3(cfg, reader) -> None:
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    rope = _rope_dict(cfg)
    rope.setdefault("rope_theta", getattr(cfg, "rope_theta", None) or 10000.0)
    dims = _value(reader, "phi3.rope.dimension_count")
    if dims and int(dims) < head_dim:
        rope["partial_rotary_factor"] = int(dims) / head_dim
        cfg.partial_rotary_factor = int(dims) / head_dim
    window = _value(reader, "phi3.attention.sliding_window")
    if window is not None:
        cfg.sliding_window = int(window) or None
    long, short = _tensor(reader, "rope_factors_long.weight"), _tensor(reader, "rope_factors_short.weight")
    original = _value(reader, "phi3.rope.scaling.original_context_length")
    if long and short and original:
        rope.update(rope_type="longrope", long_factor=long, short_factor=short,
                    original_max_position_embeddings=int(original))  # fmt: skip
        attn = _value(reader, "phi3.rope.scaling.attn_factor")
        if attn is not None:
            rope["attention_factor"] = float(attn)
        cfg.original_max_position_embeddings = int(original)
    cfg.rope_parameters = rope


def _gemma(cfg, reader, arch: str) -> None:
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    big = cfg.num_hidden_layers == _GEMMA_27B_LAYERS[arch]
    cfg.query_pre_attn_scalar = cfg.hidden_size // cfg.num_attention_heads if big else head_dim
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        value = _value(reader, f"{arch}.{key}")
        if value is not None:
            setattr(cfg, key, float(value))
    if arch == "gemma3" and str(_value(reader, "gemma3.rope.scaling.type") or "").lower() == "linear":
        factor = float(_value(reader, "gemma3.rope.scaling.factor") or 1.0)
        rope = _rope_dict(cfg)
        full = dict(rope.get("full_attention") or {})
        full.setdefault("rope_theta", getattr(cfg, "rope_theta", None) or 1000000.0)
        full.update(rope_type="linear", factor=factor)
        rope["full_attention"] = full
        rope.setdefault("sliding_attention", {"rope_type": "default", "rope_theta": 10000.0})
        cfg.rope_parameters = rope
