"""WeightKernel: the one description of a runtime weight that every back end reads.

A back end that runs its own code over the weights (the CPU decode back ends in platforms/cpu: eager, the
compiled graph, the C layer step) needs to know what lies in memory, not which class holds it. A weight
answers `kernel()` with a WeightKernel (its layout, named buffers, sizes, whether wslm's C kernels read it,
and the product its own `apply` runs for few rows), or with a string saying why it has no layout a back end
knows; `weight_kernel(w)` asks it (a plain tensor is the dense layout). Each back end builds its own call from
the description and takes the weight's own `apply` (or passes the model on) for a layout it does not read.

Layouts and their buffers:
- "dense": weight [n, k] in the activations' dtype.
- "int8": qweight int8 [n, k], scales [n] (w = q * scale per row).
- "int4": packed (torch's int4 pack for the weight's device), scales_and_zeros [k // group, n, 2]; group columns per (scale,
  zero); block: the pack's rows per block where wslm's kernels read it back (0: a pack they do not know);
  perm [k] where the activations are permuted first (act-order GPTQ).
- "gguf": blocks, the C struct of the file's blocks in place (kernels/cpu_gguf.py).
A layout no back end here reads as it is may offer `repacked`: the same weight in another runtime form
(GGUF blocks: the int4 / int8 forms the loader gave before), made once and kept."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

LAYOUTS = ("dense", "int8", "int4", "gguf")


@dataclass(frozen=True, eq=False)
class WeightKernel:
    layout: str  # one of LAYOUTS
    n: int  # output features
    k: int  # input features
    buffers: dict[str, Any] = field(default_factory=dict)  # the layout's buffers by name (above)
    group: int = 0  # int4: input columns per (scale, zero)
    block: int = 0  # int4: the pack's rows per block where wslm's C kernels read it, else 0
    # The activations' dtype the products take (the int kernels: bf16, also under a float32 engine, whose
    # rows go in converted and come back, as apply does); None: bfloat16 or float32 as they come.
    dtype: torch.dtype | None = None
    c_kernel: bool = False  # wslm's C kernels (kernels/cpu_gemv.c, cpu_gguf.c, cpu_layer.c) read these buffers
    # x -> x @ w.T for 2-D contiguous rows in `dtype`, fewer than mm_rows of them: the product the weight's
    # own apply runs for such rows (so a back end that calls it picks the same kernel); None: apply only.
    mm: Callable[[torch.Tensor], torch.Tensor] | None = None
    mm_rows: int = 0
    repacked: Callable[[], Any] | None = None  # the same weight in another runtime form, made once

    def tensor(self, name: str) -> torch.Tensor | None:
        return self.buffers.get(name)


def weight_kernel(weight: Any) -> WeightKernel | str:
    """The weight's kernel description, or why it has none (a format of one's own without `kernel()`: its
    own apply serves it on every path)."""
    if isinstance(weight, torch.Tensor):
        if weight.dim() != 2:
            return f"a {weight.dim()}-D dense weight"
        n, k = weight.shape
        c = weight.dtype in (torch.bfloat16, torch.float32) and weight.is_contiguous() and weight.device.type == "cpu"
        return WeightKernel("dense", n, k, {"weight": weight}, dtype=weight.dtype, c_kernel=c)
    describe = getattr(weight, "kernel", None)
    if describe is None:
        return f"{type(weight).__name__} weights describe no kernel layout"
    return describe()
