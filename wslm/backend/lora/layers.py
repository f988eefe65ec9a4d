"""The hook a base linear layer calls after its own product (Linear.__call__: `out = self.lora(x, out)`):
adds each token row's adapter delta, leaving the base weight (dense or quantized) untouched.

CPU: the resident adapters' A of this layer are stacked into one [sum of ranks, in] matrix and each output
part's B side by side into one [rows, sum of ranks] matrix (the adapters' own values, nothing padded), so a
step takes one x @ A^T for every row, a mask that keeps each row's own adapter's columns (zero for rows of
the base), and one matmul per output part: a handful of ops per layer however many adapters the step mixes.
CUDA: the resident adapters sit in slot buffers [max_loras, R, in] / [max_loras, out, R] and one batched
kernel (wslm/kernels/triton_lora.py) serves every row by its slot."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from wslm.backend.lora.weights import LayerDelta


@dataclass(slots=True)
class LoraBatch:
    """One step's rows: the adapter id of each row (0: the base), the ids present, and on CUDA each row's slot
    (-1: the base). masks: per column layout, the step's row/column mask (made by the first layer asking)."""

    row_ids: torch.Tensor
    ids: frozenset[int]
    token_slot: torch.Tensor | None = None
    masks: dict[int, torch.Tensor] = field(default_factory=dict)


class LoraState:
    """Shared by every hook of one model: the step being run (None between steps and for base-only steps), and
    the column layouts hooks share (so that a step makes each mask once)."""

    __slots__ = ("batch", "layouts")

    def __init__(self) -> None:
        self.batch: LoraBatch | None = None
        self.layouts: dict[tuple[int, ...], torch.Tensor] = {}

    def layout(self, ids: tuple[int, ...], device: torch.device) -> torch.Tensor:
        col = self.layouts.get(ids)
        if col is None:
            col = self.layouts[ids] = torch.tensor(ids, dtype=torch.int64, device=device)
        return col


class LoraLinear:
    __slots__ = ("state", "members", "a_all", "parts_all", "col_ids", "stack_a", "stack_b", "kernel", "max_rank",
                 "device")

    def __init__(self, state: LoraState, linear, slots: int, max_rank: int, slot_kernel=None) -> None:
        """slot_kernel: lora_delta over slot buffers (wslm/kernels), or None for the stacked CPU layout."""
        self.state = state
        self.members: dict[int, LayerDelta] = {}  # by lora_int_id (CPU: views into the stacked matrices)
        self.a_all: torch.Tensor | None = None
        self.parts_all: list[tuple[int, int, int, int, torch.Tensor]] = []  # (row, rows, column, columns, B)
        self.col_ids: torch.Tensor | None = None  # the adapter of each column of x @ a_all^T
        self.stack_a = self.stack_b = self.kernel = None
        self.max_rank = max_rank
        self.device = getattr(linear, "device", torch.device("cpu"))
        if slot_kernel is not None:
            dtype, r = linear.params_dtype, len(linear.output_sizes) * max_rank  # each part owns max_rank columns
            self.stack_a = torch.zeros((slots, r, linear.input_size), dtype=dtype, device=self.device)
            self.stack_b = torch.zeros((slots, sum(linear.output_sizes), r), dtype=dtype, device=self.device)
            self.kernel = slot_kernel

    def nbytes(self) -> int:
        tensors = [self.stack_a, self.stack_b, self.a_all, *(b for *_, b in self.parts_all)]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def put(self, lora_int_id: int, slot: int, delta: LayerDelta | None) -> None:
        """Make an adapter resident here (delta None: it leaves this layer alone)."""
        if self.stack_a is not None:  # CUDA: the slot buffers are the only copy
            self.stack_a[slot].zero_()
            self.stack_b[slot].zero_()
            for i, (r0, n, a, b) in enumerate(delta.parts if delta is not None else []):
                col = i * self.max_rank
                self.stack_a[slot, col : col + a.shape[0]] = a
                self.stack_b[slot, r0 : r0 + n, col : col + a.shape[0]] = b
            return
        if delta is not None:
            self.members[lora_int_id] = delta
            self._restack()

    def drop(self, lora_int_id: int) -> None:
        if self.members.pop(lora_int_id, None) is not None:
            self._restack()

    def _restack(self) -> None:
        """Stack the members' parts: columns grouped by output part, each part's adapters side by side; the
        members' tensors become views of the stacks (no second copy)."""
        if not self.members:
            self.a_all, self.parts_all, self.col_ids = None, [], None
            return
        by_part: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (row, rows) -> [(id, index in parts)]
        for lora_int_id, delta in self.members.items():
            for k, (r0, n, _, _) in enumerate(delta.parts):
                by_part.setdefault((r0, n), []).append((lora_int_id, k))
        a_pieces, ids, parts_all, col = [], [], [], 0
        for (r0, n), owners in sorted(by_part.items()):
            bs = []
            for lora_int_id, k in owners:
                a = self.members[lora_int_id].parts[k][2]
                a_pieces.append(a)
                bs.append(self.members[lora_int_id].parts[k][3])
                ids += [lora_int_id] * a.shape[0]
            width = sum(b.shape[1] for b in bs)
            parts_all.append((r0, n, col, width, torch.cat(bs, dim=1).contiguous()))
            col += width
        a_all = torch.cat(a_pieces).contiguous()
        # The members now point into the stacks, so the stacks are the only copy (A's rows and h's columns
        # run in the same order).
        views = {}
        for (_, _, c0, _, b_all), (_, owners) in zip(parts_all, sorted(by_part.items())):
            c = c0
            for lora_int_id, k in owners:
                r = self.members[lora_int_id].parts[k][2].shape[0]
                views[(lora_int_id, k)] = (a_all[c : c + r], b_all[:, c - c0 : c - c0 + r])
                c += r
        for lora_int_id, delta in self.members.items():
            delta.parts = [(r0, n, *views[(lora_int_id, k)]) for k, (r0, n, _, _) in enumerate(delta.parts)]
        self.a_all, self.parts_all = a_all, parts_all
        self.col_ids = self.state.layout(tuple(ids), a_all.device)

    def __call__(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        batch = self.state.batch
        if batch is None:
            return out
        if self.kernel is not None:
            return self.kernel(x, self.stack_a, self.stack_b, batch.token_slot, out)
        if self.a_all is None or batch.ids.isdisjoint(self.members):
            return out
        mask = batch.masks.get(id(self.col_ids))
        if mask is None:
            mask = batch.masks[id(self.col_ids)] = (batch.row_ids.unsqueeze(1) == self.col_ids).to(x.dtype)
        h = F.linear(x, self.a_all).mul_(mask)
        for r0, n, c0, c, b in self.parts_all:
            if r0 == 0 and n == out.shape[-1]:
                out.addmm_(h[:, c0 : c0 + c], b.t())
            else:
                out[:, r0 : r0 + n].addmm_(h[:, c0 : c0 + c], b.t())
        return out
