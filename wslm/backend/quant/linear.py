"""One call for every weight format: a dense tensor goes to F.linear, a quantized weight to its kernel."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from wslm.backend.quant.int4 import Int4Codes, Int4Weight, cat_codes
from wslm.backend.quant.int8 import Int8Weight, quantize_int8
from wslm.backend.quant.registry import get_method, quantizes_on_load

QuantWeight = Int8Weight | Int4Weight
_HEAD_SLICE = 4096  # rows of a dense head expanded to float32 at once (a whole 49k-row head: 113 MB)


def apply_linear(x: torch.Tensor, weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    if isinstance(weight, torch.Tensor):
        return F.linear(x, weight, bias)
    return weight.apply(x, bias)


def head_logits(x: torch.Tensor, weight, float32: bool = False) -> torch.Tensor:
    """An LM head's logits. float32 (steps that score prompt tokens): every row's from unrounded sums, the
    weight expanded to float32 a slice at a time (1.5-3x the head's bf16 GEMM). Otherwise float32 where the
    weight's kernel gives them so at no cost (an int8 head on a few rows: Int8Weight.logits), else the
    product in the activations' dtype: rounding logits to bf16 costs the demo a mean KL of 0.0004 nats."""
    exact = getattr(weight, "logits", None)
    out = exact(x, float32) if exact is not None else None
    if out is None and float32 and x.dtype != torch.float32 and isinstance(weight, torch.Tensor):
        xf = x.float()
        out = torch.cat([F.linear(xf, weight[r : r + _HEAD_SLICE].float())
                         for r in range(0, weight.shape[0], _HEAD_SLICE)], dim=-1)  # fmt: skip
    return out if out is not None else apply_linear(x, weight)


def embedding(ids: torch.Tensor, weight, dtype: torch.dtype | None = None) -> torch.Tensor:
    if isinstance(weight, torch.Tensor):
        return F.embedding(ids, weight)
    rows = getattr(weight, "embedding", None)  # int8 tables
    if rows is not None:
        return rows(ids, dtype or torch.float32)
    raise TypeError(f"embedding tables are dense or int8, not {type(weight).__name__}")


def is_quantized(weight) -> bool:
    return not isinstance(weight, torch.Tensor)


def fuse_rows(parts: list) -> object:
    """Concatenate along output rows (q|k|v, gate|up), whatever the parts' formats. Mixed formats (a
    Q4_K_M file keeps some v projections in Q6_K) meet at the richer one: the int4 parts go to int8. GGUF
    block weights (gguf_blocks.py) are fused as a list of their parts, nothing copied."""
    if all(isinstance(p, torch.Tensor) for p in parts):
        return torch.cat(parts, dim=0).contiguous()
    kinds = {getattr(p, "kind", None) for p in parts}
    fuse = getattr(type(parts[0]), "fuse", None) if len(kinds) == 1 and None not in kinds else None
    if fuse is not None:  # a format's own fusion (gguf_blocks.GGUFBlockWeight: the blocks stay in the file)
        fused = fuse(parts)
        if fused is not None:
            return fused
    if all(isinstance(p, Int4Codes) for p in parts) and len({p.group_size for p in parts}) == 1:
        perms = [p.perm for p in parts]
        if all(q is None for q in perms) or all(q is not None and torch.equal(q, perms[0]) for q in perms):
            return cat_codes(parts)
        # Act-order GPTQ sorts each linear's input columns its own way: parts that disagree cannot share
        # one activation permutation, so they stay separate matmuls.
        return RowStack(parts)
    if any(isinstance(p, torch.Tensor) and p.dtype == torch.float32 for p in parts):
        # float32 parts beside quantized ones come from GGUF's exact float32 switch (gguf_weights.
        # dequantize_mode): int8 would re-quantize every part, so all stay dense and exact.
        return torch.cat([_dense(p) for p in parts]).contiguous()
    as_int8 = [p if isinstance(p, Int8Weight) else quantize_int8(_dense(p)) for p in parts]
    dtype = as_int8[0].scales.dtype
    return Int8Weight(
        torch.cat([p.qweight for p in as_int8]), torch.cat([p.scales.to(dtype) for p in as_int8])
    )


def _dense(p) -> torch.Tensor:
    return p.float() if isinstance(p, torch.Tensor) else p.dequantize(torch.float32)


class RowStack:
    """Weights fused by rows that must stay separate matmuls (outputs concatenated)."""

    __slots__ = ("parts",)
    kind = "row_stack"

    def __init__(self, parts: list) -> None:
        self.parts = parts

    @property
    def bits(self) -> int:
        return max(p.bits for p in self.parts)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((sum(p.shape[0] for p in self.parts), self.parts[0].shape[1]))

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = torch.cat([p.apply(x) for p in self.parts], dim=-1)
        return out if bias is None else out + bias

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.cat([p.dequantize(dtype) for p in self.parts])

    def to_runtime(self, device: torch.device, dtype: torch.dtype) -> RowStack:
        return RowStack([finalize(p, device, dtype) for p in self.parts])


def finalize(weight, device: torch.device, dtype: torch.dtype):
    """The runtime form on the engine's device: dense tensors in the model dtype, int4 codes packed."""
    if isinstance(weight, torch.Tensor):
        return weight.to(device=device, dtype=dtype)
    to_runtime = getattr(weight, "to_runtime", None)  # int4 codes, int8, RowStack; packed int4 is final
    return weight if to_runtime is None else to_runtime(device, dtype)


# Checkpoint names that the model fuses with siblings (q|k|v, gate|up): kept unpacked until all parts arrive.
_FUSED_PARTS = ("q_proj.", "k_proj.", "v_proj.", "gate_proj.", "up_proj.")
_TABLES = ("embed_tokens.", "lm_head.")


def prepare_weight(weight, method: str | None, name: str, device: torch.device, dtype: torch.dtype):
    """A checkpoint weight on its way into the model: quantized now when method asks (int8 / int4 on the
    fly), left unpacked when it still has to be fused with its siblings, else in its runtime form."""
    if isinstance(weight, torch.Tensor) and quantizes_on_load(method):
        weight = quantize_on_load(weight, method, is_table=any(t in name for t in _TABLES))
    if any(p in name for p in _FUSED_PARTS):
        return weight.to(device=device, dtype=dtype) if isinstance(weight, torch.Tensor) else weight
    return finalize(weight, device, dtype)


def quantize_on_load(w: torch.Tensor, method: str, is_table: bool = False, group_width: int | None = None):
    """w in an on-the-fly format (QuantMethod.quantize): int8 per output channel; int4 groups sized to
    group_width (the input width, or one tensor-parallel rank's share of it); tables by rows."""
    return get_method(method).quantize(w, is_table=is_table, group_width=group_width)
