"""One adapter's A and B laid out for the base's fused linear layers, never merged into them.

A PEFT adapter has an (A [r, in], B [out, r]) pair per projection (q_proj, k_proj, ..., down_proj); the base
fuses q|k|v and gate|up into one layer each. Per fused layer we keep each part's A and its B, scaled by
alpha / r (alpha / sqrt(r) with use_rslora) once here, beside the rows of the layer's output it adds to
(layers.py stacks the resident adapters' parts). Exactly the adapter's own numbers of values: nothing padded
to --max-lora-rank and no full-size deltas."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from wslm.backend.loader.lora import _TARGETS, LoraAdapter, load_adapter

LayerKey = tuple[int, str, str]  # (decoder layer, "self_attn" | "mlp", fused layer name)


@dataclass(slots=True)
class LayerDelta:
    """scale * (x @ A^T) @ B^T for one fused layer, per part: (first output row, rows, A [r, in], B [rows, r]
    with the scale folded in)."""

    parts: list[tuple[int, int, torch.Tensor, torch.Tensor]]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for *_, a, b in self.parts for t in (a, b))


@dataclass(slots=True)
class AdapterWeights:
    lora_int_id: int
    rank: int
    layers: dict[LayerKey, LayerDelta]

    def nbytes(self) -> int:
        return sum(d.nbytes() for d in self.layers.values())


def base_layers(model) -> dict[LayerKey, object]:
    """The base's linear layers an adapter may target, by key."""
    out = {}
    for i, layer in enumerate(getattr(model, "layers", [])):
        for block, targets in _TARGETS.items():
            module = getattr(layer, block, None)
            for name in {fused for fused, _ in targets.values()}:
                linear = getattr(module, name, None)
                if linear is not None and hasattr(linear, "output_sizes") and hasattr(linear, "shard_names"):
                    out[(i, block, name)] = linear
    return out


def build_adapter(model, lora_int_id: int, path: str, max_rank: int, adapter: LoraAdapter | None = None
                  ) -> AdapterWeights:
    """The adapter at path as LayerDeltas on model's device and dtype. ValueError naming the cause and the
    fix: a rank above max_rank, a projection the base lacks (an adapter for another model), shapes that do
    not fit."""
    adapter = adapter or load_adapter(path)
    if adapter.rank > max_rank:
        raise ValueError(f"{path}: the adapter's rank is {adapter.rank}, above --max-lora-rank {max_rank}; raise "
                         f"--max-lora-rank (max_lora_rank) to {adapter.rank} or more")
    targets = base_layers(model)
    device, dtype = model.device, model.dtype
    grouped: dict[LayerKey, list] = {}
    for (index, block, target), (a, b) in sorted(adapter.pairs.items()):
        name, part = _TARGETS[block][target]
        linear = targets.get((index, block, name))
        if linear is None:
            what = "layers" if index >= len(getattr(model, "layers", [])) else f"a dense {block}.{name}"
            raise ValueError(f"{adapter.path}: the adapter changes layer {index} {target}, and the model has no "
                             f"such projection (no {what} there: an adapter for another model, or a MoE layer, "
                             "which LoRA does not target here)")
        sizes = linear.output_sizes
        if part is None:
            r0, rows = 0, sum(sizes)
        else:
            k = linear.shard_names.index(part)
            r0, rows = sum(sizes[:k]), sizes[k]
        if tuple(a.shape) != (a.shape[0], linear.input_size) or tuple(b.shape) != (rows, a.shape[0]):
            raise ValueError(f"{adapter.path}: layer {index} {target} is {tuple(b.shape)} x {tuple(a.shape)} in the "
                             f"adapter but the model's projection is {rows} x {linear.input_size} (an adapter for "
                             "another model?)")
        grouped.setdefault((index, block, name), []).append((r0, rows, a, b))
    layers = {}
    for key, parts in grouped.items():
        parts.sort(key=lambda p: p[0])
        layers[key] = LayerDelta([(r0, rows, a.float().to(device=device, dtype=dtype).contiguous(),
                                   (b.float() * adapter.scale).to(device=device, dtype=dtype).contiguous())
                                  for r0, rows, a, b in parts])
    return AdapterWeights(lora_int_id, adapter.rank, layers)
