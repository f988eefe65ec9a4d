"""The weight formats (`quantization=`) and the runtime weight forms they load to, in one place.

Code outside wslm.backend.quant never switches on a quantized weight's class: each runtime form carries its
`kind` and the hooks the engine asks of it (QuantizedWeight below); a plain torch.Tensor is the dense form.
Importing this module imports no torch (`wslm models` and the config parser read it)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Any, Protocol


@dataclass(frozen=True)
class QuantMethod:
    """One value of LLM(quantization=...) / --quantization (None: dense)."""

    name: str | None
    description: str
    weight_kinds: tuple[str, ...]  # runtime forms its quantized linear weights take (keys of WEIGHT_CLASSES)
    on_the_fly: bool = False  # quantizes a 16-bit checkpoint while it loads
    prequantized: bool = False  # the checkpoint file itself holds the format


DENSE = QuantMethod(None, "the checkpoint's 16/32-bit weights as they are", ())

# vLLM's names, in the order the CLI and error messages list them.
METHODS: dict[str | None, QuantMethod] = {
    m.name: m
    for m in (
        QuantMethod("gguf", "GGUF file: Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K computed in the file's own "
                    "blocks, memory-mapped; other types repacked (int4 / int8)", ("gguf", "int4", "int8"),
                    prequantized=True),
        QuantMethod("awq", "AutoAWQ GEMM safetensors repacked to int4", ("int4",), prequantized=True),
        # int8: act-order column shards under tensor parallelism (shard.py)
        QuantMethod("gptq", "GPTQ safetensors repacked to int4", ("int4", "int8"), prequantized=True),
        QuantMethod("int8", "16-bit weights quantized at load, int8 per output channel", ("int8",),
                    on_the_fly=True),
        # int8: embedding / lm_head tables and widths int4 groups do not divide
        QuantMethod("int4", "16-bit weights quantized at load, int4 groups of up to 128", ("int4", "int8"),
                    on_the_fly=True),
        DENSE,
    )
}  # fmt: skip

# Runtime weight classes by kind, imported on first use (they import torch).
WEIGHT_CLASSES: dict[str, tuple[str, str]] = {
    "int8": ("wslm.backend.quant.int8", "Int8Weight"),
    "int4": ("wslm.backend.quant.int4", "Int4Weight"),
    "gguf": ("wslm.backend.quant.gguf_blocks", "GGUFBlockWeight"),
}


def get_method(name: str | None) -> QuantMethod:
    """The method for a checked name (check_quantization's result); KeyError for any other."""
    return METHODS[name]


def quantizes_on_load(name: str | None) -> bool:
    """Whether `name` quantizes dense checkpoint weights while loading (int8 / int4)."""
    method = METHODS.get(name)
    return method is not None and method.on_the_fly


def weight_class(kind: str) -> type:
    module, cls = WEIGHT_CLASSES[kind]
    return getattr(import_module(module), cls)


def weight_kind(weight: Any) -> str:
    """The kind of a weight: "dense" for a plain tensor, else the quantized weight's ("int8", "int4", ...)."""
    kind = getattr(weight, "kind", None)
    return "dense" if kind is None else kind


class QuantizedWeight(Protocol):
    """What a runtime quantized weight offers (int8.Int8Weight, int4.Int4Weight; linear.RowStack offers the
    first group only). The CPU decode hooks are optional: callers look them up with getattr once, at bind
    time, and a weight without one takes the general path (its own apply)."""

    kind: str
    bits: int

    @property
    def shape(self) -> Any: ...

    @property
    def nbytes(self) -> int: ...

    def apply(self, x: Any, bias: Any = None) -> Any: ...

    def dequantize(self, dtype: Any = ...) -> Any: ...

    # CPU decode hooks (platforms/cpu/decode_*.py):
    def decode_row_limit(self) -> int | None:
        """Rows below which decode_rows is the kernel apply picks; None where decode_rows does not apply."""
        ...

    def decode_rows(self, x: Any) -> Any: ...

    def c_kernel(self) -> bool:
        """Whether cpu_gemv's C kernels read this weight."""
        ...

    def c_view(self) -> tuple | str:
        """(kind, weight, scales, group, n, k, block) for cpu_layer.c, or why the C step cannot take it."""
        ...

    def graph_spec(self, bias: Any, c_kernels: bool = True) -> tuple | None:
        """(kind, tensors, extra) for the compiled decode graph, or None where it cannot take the weight."""
        ...


# Loading forms (int4.Int4Codes, int8.Int8Weight) also offer shard(dim, start, length) for tensor parallelism
# (shard.narrow), take_rows(rows) (GGUF's q/k order) and to_runtime(device, dtype) (linear.finalize); int8
# tables embedding(ids, dtype) and append_zero_rows(missing) (shard.pad_rows).
