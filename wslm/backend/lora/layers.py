"""The hook a base linear layer calls after its own product (Linear.__call__: `out = self.lora(x, out)`):
adds each token row's adapter delta, leaving the base weight (dense or quantized) untouched.

CPU: per adapter in the step, its rows (a slice when they are contiguous, else their indices) go through
that adapter's own A and B (segmented matmuls, weights.LayerDelta). CUDA: the resident adapters also sit
in slot buffers [max_loras, R, in] / [max_loras, out, R] and one batched kernel (wslm/kernels/triton_lora.py)
serves every row by its slot."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from wslm.backend.lora.weights import LayerDelta


@dataclass(slots=True)
class LoraBatch:
    """The step's rows per adapter: (lora_int_id, a slice or an index tensor of rows), and on CUDA the slot
    of every row (-1: the base alone)."""

    groups: list[tuple[int, slice | torch.Tensor]] = field(default_factory=list)
    token_slot: torch.Tensor | None = None


class LoraState:
    """Shared by every hook of one model: the step being run (None between steps and for base-only steps)."""

    __slots__ = ("batch",)

    def __init__(self) -> None:
        self.batch: LoraBatch | None = None


class LoraLinear:
    __slots__ = ("state", "deltas", "stack_a", "stack_b", "kernel", "layout")

    def __init__(self, state: LoraState, linear, slots: int, max_rank: int) -> None:
        self.state = state
        self.deltas: dict[int, LayerDelta] = {}  # by lora_int_id
        self.stack_a = self.stack_b = self.kernel = None
        parts = len(linear.output_sizes)
        self.layout = (parts, max_rank)  # slot buffers: each part owns max_rank columns
        device = getattr(linear, "device", torch.device("cpu"))
        if device.type == "cuda":
            from wslm.kernels.dispatch import selected_backend

            dtype = linear.params_dtype
            r = parts * max_rank
            self.stack_a = torch.zeros((slots, r, linear.input_size), dtype=dtype, device=device)
            self.stack_b = torch.zeros((slots, sum(linear.output_sizes), r), dtype=dtype, device=device)
            if selected_backend(device) == "triton":
                from wslm.kernels.triton_lora import lora_delta
            else:
                from wslm.kernels.torch_lora import lora_delta
            self.kernel = lora_delta

    def nbytes(self) -> int:
        stacks = sum(t.numel() * t.element_size() for t in (self.stack_a, self.stack_b) if t is not None)
        return stacks + sum(d.nbytes() for d in self.deltas.values())

    def put(self, lora_int_id: int, slot: int, delta: LayerDelta | None) -> None:
        """Make an adapter resident here (delta None: it leaves this layer alone)."""
        if self.stack_a is not None:
            self.stack_a[slot].zero_()
            self.stack_b[slot].zero_()
            if delta is not None:  # part p's columns start at p * max_rank: the layout every slot shares
                for (r0, n, c0, c, b), col in zip(delta.parts, self._columns(delta)):
                    self.stack_a[slot, col : col + c] = delta.a[c0 : c0 + c]
                    self.stack_b[slot, r0 : r0 + n, col : col + c] = b
            return  # on CUDA the slot buffers are the only copy
        if delta is not None:
            self.deltas[lora_int_id] = delta

    def _columns(self, delta: LayerDelta) -> list[int]:
        parts, max_rank = self.layout
        return [i * max_rank for i in range(len(delta.parts))]

    def drop(self, lora_int_id: int) -> None:
        self.deltas.pop(lora_int_id, None)

    def __call__(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        batch = self.state.batch
        if batch is None:
            return out
        if self.kernel is not None:
            return self.kernel(x, self.stack_a, self.stack_b, batch.token_slot, out)
        for lora_int_id, rows in batch.groups:
            delta = self.deltas.get(lora_int_id)
            if delta is not None:
                delta.apply(x, out, rows)
        return out
