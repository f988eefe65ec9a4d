"""LoRA adapters in PEFT's format (a folder with adapter_config.json and adapter_model.safetensors or
adapter_model.bin), merged into a model's weights as it loads: W + (alpha / r) * B @ A (alpha / sqrt(r) with
use_rslora), computed in float32, what peft's merge_and_unload computes.

Merging (`LLM(model, lora_path=...)`, `wslm serve --lora-path`) puts one adapter into an engine's weights.
Adapters per request over one shared base (`enable_lora`, `--lora-modules`) are wslm/backend/lora, which
reads adapters with load_adapter here and never changes the base.

Merging needs the base's 16/32-bit weights: a base held quantized (GGUF, AWQ/GPTQ, int8/int4) is refused,
as is tensor parallelism (each rank would need its slice of every delta)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

# PEFT target -> (our fused layer, which part of its output rows).
_TARGETS = {
    "self_attn": {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
                  "qkv_proj": ("qkv_proj", None), "o_proj": ("o_proj", None)},
    "mlp": {"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1), "gate_up_proj": ("gate_up_proj", None),
            "down_proj": ("down_proj", None)},
}  # fmt: skip
_KEY = re.compile(r"layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.default)?\.weight$")


@dataclass
class LoraAdapter:
    path: Path
    rank: int
    scale: float
    # (layer, block, target) -> (A [r, in], B [out, r])
    pairs: dict[tuple[int, str, str], tuple[torch.Tensor, torch.Tensor]]


def read_adapter_config(path: str | Path) -> dict:
    """adapter_config.json of a PEFT LoRA folder; ValueError naming what is wrong and what to give instead."""
    folder = Path(path).expanduser()
    config_file = folder / "adapter_config.json"
    if not config_file.is_file():
        raise ValueError(f"{folder} is not a LoRA adapter: it has no adapter_config.json (give the folder peft's "
                         "save_pretrained wrote)")
    config = json.loads(config_file.read_text())
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise ValueError(f"{folder} is a {config.get('peft_type')} adapter; only LoRA adapters are served")
    if not isinstance(config.get("r"), int) or config["r"] < 1:
        raise ValueError(f"{config_file}: `r` must be a positive whole number, got {config.get('r')!r}")
    return config


def check_adapter(path: str | Path, max_rank: int) -> dict:
    """The adapter's config, after the checks a server makes before it loads anything: a LoRA folder with
    weights, of rank at most max_rank (vLLM's --max-lora-rank)."""
    config = read_adapter_config(path)
    if config["r"] > max_rank:
        raise ValueError(f"{path}: the adapter's rank is {config['r']}, above --max-lora-rank {max_rank}; raise "
                         f"--max-lora-rank to {config['r']} or more")
    _weights_file(Path(path).expanduser())
    return config


def _weights_file(folder: Path) -> Path:
    for name in ("adapter_model.safetensors", "adapter_model.bin"):
        if (folder / name).is_file():
            return folder / name
    raise ValueError(f"{folder} has no adapter_model.safetensors (or adapter_model.bin): the adapter's weights")


def load_adapter(path: str | Path) -> LoraAdapter:
    folder = Path(path).expanduser()
    config = read_adapter_config(folder)
    weights = _weights_file(folder)
    if weights.suffix == ".safetensors":
        from safetensors.torch import load_file

        tensors = load_file(str(weights))
    else:
        tensors = torch.load(weights, map_location="cpu", weights_only=True)
    rank = config["r"]
    alpha = config.get("lora_alpha", rank)
    scale = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
    halves: dict[tuple[int, str, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        m = _KEY.search(key)
        if m is None or m.group(3) not in _TARGETS[m.group(2)]:
            raise ValueError(f"{folder}: the adapter changes {key!r}, which wslm cannot merge (LoRA on the "
                             "attention and MLP projections is supported; embeddings, the head, MoE experts and "
                             "biases are not)")
        halves.setdefault((int(m.group(1)), m.group(2), m.group(3)), {})[m.group(4)] = tensor
    pairs = {}
    for where, ab in halves.items():
        if set(ab) != {"A", "B"}:
            raise ValueError(f"{folder}: layer {where[0]} {where[2]} has lora_{next(iter(ab))} without its pair")
        pairs[where] = (ab["A"], ab["B"])
    return LoraAdapter(folder, rank, scale, pairs)


def merge_lora(model, path: str | Path) -> int:
    """Adds the adapter at path to model's weights in place; returns how many projections it changed.
    ValueError (naming the cause and the fix) for weights it cannot merge into or shapes that do not fit."""
    adapter = load_adapter(path)
    layers = model.layers
    for (index, block, target), (a, b) in sorted(adapter.pairs.items()):
        if index >= len(layers):
            raise ValueError(f"{adapter.path}: the adapter has layer {index}; the model has {len(layers)} layers "
                             "(an adapter for another model?)")
        name, part = _TARGETS[block][target]
        layer = getattr(getattr(layers[index], block), name, None)
        weight = getattr(layer, "weight", None)
        if not isinstance(weight, torch.Tensor):
            raise ValueError(f"LoRA adapters merge into 16/32-bit weights, and this model keeps its weights "
                             f"quantized ({type(weight).__name__}): serve the adapter per request instead "
                             "(enable_lora=True, `wslm serve --enable-lora --lora-modules`: the base stays as it "
                             "is), merge it into the model's 16-bit checkpoint, or merge it with peft "
                             "(merge_and_unload) before quantizing")
        start, rows = _rows(layers[index], block, part, weight)
        delta = (b.float() @ a.float()) * adapter.scale
        if delta.shape != (rows, weight.shape[1]):
            raise ValueError(f"{adapter.path}: layer {index} {target} is {tuple(delta.shape)} in the adapter but "
                             f"{(rows, weight.shape[1])} in the model (an adapter for another model?)")
        view = weight.data[start : start + rows]
        view.copy_((view.float() + delta.to(view.device)).to(weight.dtype))
    return len(adapter.pairs)


def _rows(layer, block: str, part, weight: torch.Tensor) -> tuple[int, int]:
    """(first row, rows) of a PEFT target inside our fused layer's weight."""
    if part is None:
        return 0, weight.shape[0]
    if block == "mlp":
        half = weight.shape[0] // 2
        return part * half, half
    q, kv = layer.self_attn.q_size, layer.self_attn.kv_size
    return {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}[part]
