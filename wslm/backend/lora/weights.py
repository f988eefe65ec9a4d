"""One adapter's A and B laid out for the base's fused linear layers, never merged into them.

A PEFT adapter has an (A [r, in], B [out, r]) pair per projection (q_proj, k_proj, ..., down_proj); the base
fuses q|k|v and gate|up into one layer each. Per fused layer we keep the A of every part it has stacked into
one [sum r, in] matrix (one x @ A^T for the layer) and each part's B, scaled by alpha / r (alpha / sqrt(r)
with use_rslora) once here, beside the rows of the layer's output it adds to. Exactly the adapter's own
numbers of values: nothing padded to --max-lora-rank and no full-size deltas."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from wslm.backend.loader.lora import _TARGETS, LoraAdapter, load_adapter

LayerKey = tuple[int, str, str]  # (decoder layer, "self_attn" | "mlp", fused layer name)


@dataclass(slots=True)
class LayerDelta:
    """scale * (x @ A^T) @ B^T for one fused layer: a [R, in] (the parts' A stacked), parts: (first output row,
    rows, first column of x @ A^T, columns, B [rows, columns] with the scale folded in)."""

    a: torch.Tensor
    parts: list[tuple[int, int, int, int, torch.Tensor]]
    whole: bool  # one part covering every output row

    def nbytes(self) -> int:
        return self.a.numel() * self.a.element_size() + sum(b.numel() * b.element_size() for *_, b in self.parts)

    def apply(self, x: torch.Tensor, out: torch.Tensor, rows: slice | torch.Tensor) -> None:
        """out[rows] += delta(x[rows]); rows: a slice of the batch, or the token rows' indices."""
        if isinstance(rows, slice):
            h = F.linear(x[rows], self.a)
            target = out[rows]
            if self.whole:
                target.add_(F.linear(h, self.parts[0][4]))
                return
            for r0, n, c0, c, b in self.parts:
                target[:, r0 : r0 + n].add_(F.linear(h[:, c0 : c0 + c], b))
            return
        h = F.linear(x.index_select(0, rows), self.a)
        for r0, n, c0, c, b in self.parts:
            out[:, r0 : r0 + n].index_add_(0, rows, F.linear(h[:, c0 : c0 + c], b))


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
        a_cat = torch.cat([a.float() for _, _, a, _ in parts]).to(device=device, dtype=dtype).contiguous()
        laid, c0 = [], 0
        for r0, rows, a, b in parts:
            c = a.shape[0]
            laid.append((r0, rows, c0, c, (b.float() * adapter.scale).to(device=device, dtype=dtype).contiguous()))
            c0 += c
        whole = len(laid) == 1 and laid[0][0] == 0 and laid[0][1] == sum(targets[key].output_sizes)
        layers[key] = LayerDelta(a_cat, laid, whole)
    return AdapterWeights(lora_int_id, adapter.rank, layers)
