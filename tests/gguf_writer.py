"""A model's weights as a GGUF written with gguf's writer, shaped as llama.cpp's converter writes them (its
tensor names, its extra keys per family, Gemma's 1 + w norms), for the GGUF loading tests."""

from __future__ import annotations


def _add_family_keys(w, arch: str, cfg, head_dim: int) -> None:
    """The keys (and rope factor tensors) llama.cpp's converter writes beyond the common ones."""
    import math

    import numpy as np
    from gguf import RopeScalingType

    rope = cfg.rope_parameters
    if arch == "phi3":
        w.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
        w.add_sliding_window(cfg.sliding_window or 0)
        if rope.get("rope_type") == "longrope":
            original = rope["original_max_position_embeddings"]
            w.add_rope_scaling_orig_ctx_len(original)
            scale = cfg.max_position_embeddings / original
            w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)))
            w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
            w.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
    elif arch == "gemma2":
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    elif arch in ("qwen3moe", "qwen2moe"):
        w.add_expert_count(cfg.num_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        if getattr(cfg, "shared_expert_intermediate_size", None):
            w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    elif arch == "gemma3" and rope["full_attention"].get("rope_type") == "linear":
        w.add_rope_scaling_type(RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["full_attention"]["factor"])


def write_gguf(path, model, arch: str, tok_source=None, tensors=None, expert_type: str | None = None) -> None:
    """model's float32 weights as a GGUF of `arch` with gguf's writer (llama.cpp's tensor names and, for
    Gemma, its 1 + w norms), with tok_source's tokenizer copied in (None: the vocabulary size only; the
    engine then takes the tokenizer from a folder, and nothing parses 49k tokens three times). tensors:
    (HF name, tensor) pairs to write instead of model.state_dict() (MoE experts stacked per projection);
    expert_type: a GGML type name (Q8_0, Q4_0, ...) the stacked experts are quantized to with gguf's quantizers."""
    import gguf

    cfg = model.config
    n = cfg.num_hidden_layers
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_block_count(n)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(cfg.rope_parameters.get("rope_theta") or cfg.rope_parameters["full_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if getattr(cfg, "sliding_window", None):
        w.add_sliding_window(cfg.sliding_window)
    _add_family_keys(w, arch, cfg, head_dim)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if tok_source is None:
        w.add_vocab_size(cfg.vocab_size)
    for key, field in gguf.GGUFReader(str(tok_source)).fields.items() if tok_source else ():
        if key.startswith("tokenizer."):
            sub = field.types[1] if len(field.types) > 1 else None
            w.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], n)
    for name, t in tensors if tensors is not None else model.state_dict().items():
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            t = t + 1
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if expert_type and ".experts." in name:
            kind = gguf.GGMLQuantizationType[expert_type]
            w.add_tensor(gguf_name, gguf.quants.quantize(t.float().numpy(), kind), raw_dtype=kind)
        else:
            w.add_tensor(gguf_name, t.float().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
