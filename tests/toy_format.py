"""A weight format of one's own, whole in this one file (issue 36: "each weight format is one file"):
"int8-rowmax", int8 weights with one float32 scale per output row (absmax / 127), stored in a safetensors
checkpoint as `<linear>.weight` (int8) beside `<linear>.weight_scale`, config.json naming it in
quantization_config. Importing the module registers it (wslm.backend.quant.registry.register_method);
`WSLM_QUANT_MODULES=toy_format` makes `wslm serve` (and its worker processes) import it.

Nothing in wslm knows this format: the loader finds it by its quant_method, its tensors come out of its
iter_weights, `--quantization int8-rowmax` is a choice, and its weights multiply with their own apply."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F

from wslm.backend.quant.method import QuantMethod
from wslm.backend.quant.registry import register_method

NAME = "int8-rowmax"
_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class RowmaxWeight:
    """int8 codes [out, in] and a float32 scale per output row: w = q * scale[:, None]."""

    kind = NAME
    bits = 8

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor) -> None:
        self.qweight, self.scale = qweight, scale

    @classmethod
    def quantize(cls, w: torch.Tensor) -> RowmaxWeight:
        scale = w.float().abs().amax(dim=1).clamp(min=1e-8) / 127.0
        return cls(torch.round(w.float() / scale[:, None]).clamp(-127, 127).to(torch.int8), scale)

    @classmethod
    def fuse(cls, parts: list) -> RowmaxWeight | None:
        """q|k|v and gate|up as one weight of this format (linear.fuse_rows asks)."""
        return cls(torch.cat([p.qweight for p in parts]), torch.cat([p.scale for p in parts]))

    @property
    def shape(self) -> torch.Size:
        return self.qweight.shape

    @property
    def nbytes(self) -> int:
        return self.qweight.numel() + self.scale.numel() * 4

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = F.linear(x, self.qweight.to(x.dtype)) * self.scale.to(x.dtype)
        return out if bias is None else out + bias

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.qweight.float() * self.scale[:, None]).to(dtype)

    def to_runtime(self, device: torch.device, dtype: torch.dtype) -> RowmaxWeight:
        return RowmaxWeight(self.qweight.to(device), self.scale.to(device))

    def shard(self, dim: int, start: int, length: int) -> RowmaxWeight:
        """Tensor parallelism: rows keep their scales; input columns share each row's scale."""
        if dim == 0:
            return RowmaxWeight(self.qweight[start : start + length].contiguous(), self.scale[start : start + length])
        return RowmaxWeight(self.qweight[:, start : start + length].contiguous(), self.scale)


class RowmaxMethod(QuantMethod):
    name = NAME
    description = "int8 weights with a float32 absmax scale per row, stored as such (a test's own format)"
    label = "int8 rowmax (toy)"
    weight_kinds = (NAME,)
    prequantized = True
    checkpoint_names = (NAME,)

    def check_checkpoint(self, quant_config: dict) -> None:
        if int(quant_config.get("bits", 8)) != 8:
            raise ValueError(f"{NAME} checkpoints hold 8-bit weights, not {quant_config['bits']}-bit ones.")

    def iter_weights(self, source, dtype, no_mmap, read):
        codes: dict[str, torch.Tensor] = {}
        scales: dict[str, torch.Tensor] = {}
        for name, tensor in read():
            if name.endswith(".weight_scale"):
                scales[name.removesuffix("_scale")] = tensor
            elif tensor.dtype == torch.int8:
                codes[name] = tensor
            else:
                yield name, tensor
                continue
            for key in [k for k in codes if k in scales]:
                yield key, RowmaxWeight(codes.pop(key), scales.pop(key).float())
        if codes or scales:
            raise ValueError(f"{NAME} checkpoint: weights without scales or scales without weights: "
                             f"{sorted(codes) + sorted(scales)}")


METHOD = register_method(RowmaxMethod(), {NAME: RowmaxWeight})


def write_checkpoint(dense: Path, out: Path) -> Path:
    """A dense HF folder's linear weights in this format (the rest as they are), as a new folder."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(dense, out)
    for file in out.glob("*.safetensors"):
        tensors = {}
        for name, t in load_file(str(file)).items():
            if t.dim() == 2 and any(f".{p}." in name for p in _LINEARS):
                w = RowmaxWeight.quantize(t)
                tensors[name], tensors[name + "_scale"] = w.qweight, w.scale
            else:
                tensors[name] = t.contiguous()
        save_file(tensors, str(file), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {"quant_method": NAME, "bits": 8}
    (out / "config.json").write_text(json.dumps(config))
    return out
