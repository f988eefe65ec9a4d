"""PEFT-format LoRA adapter folders written by the tests (random A and B), for any Llama-shaped model:
shapes from its config.json, so no transformers model is needed."""

from __future__ import annotations

import json
from pathlib import Path

import torch

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def projection_shapes(config: dict) -> dict[str, tuple[int, int]]:
    """(out, in) of each projection of one decoder layer."""
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv = config.get("num_key_value_heads", heads) * head_dim
    return {"q_proj": (heads * head_dim, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden),
            "o_proj": (hidden, heads * head_dim), "gate_proj": (inner, hidden), "up_proj": (inner, hidden),
            "down_proj": (hidden, inner)}


def write_adapter(folder: Path, config: dict, rank: int, seed: int, targets=ALL_TARGETS, alpha: int | None = None,
                  rslora: bool = False, std: float = 0.2) -> int:
    """A PEFT LoRA folder; returns the bytes of its tensors (what the adapter weighs)."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    shapes = projection_shapes(config)
    tensors = {}
    for i in range(config["num_hidden_layers"]):
        for name in targets:
            out, inp = shapes[name]
            block = "mlp" if name in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            key = f"base_model.model.model.layers.{i}.{block}.{name}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, inp, generator=gen) * std
            tensors[f"{key}.lora_B.weight"] = torch.randn(out, rank, generator=gen) * std
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": alpha or 2 * rank, "use_rslora": rslora,
        "target_modules": list(targets), "base_model_name_or_path": "tiny", "bias": "none", "task_type": "CAUSAL_LM",
    }))  # fmt: skip
    return sum(t.numel() * t.element_size() for t in tensors.values())
