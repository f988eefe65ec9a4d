"""Shared helpers for the engine tests: tiny random-weight models saved as real HF folders."""

from __future__ import annotations

from pathlib import Path

import torch

from wslm.demo import demo_model_path


def demo_tokenizer():
    from transformers import AutoTokenizer

    path = demo_model_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def make_tiny_model(folder: Path, arch: str, tokenizer, seed: int = 0) -> Path:
    """A 2-layer model with peaky random weights (so greedy argmax is not decided by rounding)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=512,
        initializer_range=0.2,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    if arch == "llama":  # GQA, untied head, llama3 rope scaling
        config = LlamaConfig(
            num_key_value_heads=2,
            tie_word_embeddings=False,
            rope_theta=50000.0,
            rope_scaling={
                "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },  # fmt: skip
            **common,
        )
        model = LlamaForCausalLM(config)
    else:  # qkv bias, tied embeddings
        config = Qwen2Config(num_key_value_heads=1, tie_word_embeddings=True, **common)
        model = Qwen2ForCausalLM(config)
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0.0, 0.5)
    model.eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def hf_greedy(model, tokenizer, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """HF transformers' own greedy decode, cut after the first EOS."""
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
            pad_token_id=tokenizer.pad_token_id or 0,
        )  # fmt: skip
    new = out[0, len(prompt_ids) :].tolist()
    eos = tokenizer.eos_token_id
    return new[: new.index(eos) + 1] if eos in new else new
