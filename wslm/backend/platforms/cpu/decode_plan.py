"""The CPU decode plan: which back end runs a pure decode step (one new token for each sequence), decided
once per batch size instead of on every step.

Three back ends compute the same step of a Llama-shaped decoder, fastest first:
- decode_native.py: one sequence's step through every layer in one C call;
- decode_compiled.py: the step compiled by inductor (ready after a background compile; a lone chat's steps
  stay in C where C takes them, so its graph is only built for batches);
- decode_eager.py: the step in as few torch ops as the math needs (what the other two are checked against).
A back end may still pass on a step (None: a padding slot, the graph not compiled yet); the next one takes
it, and the model's own forward when none does."""

from __future__ import annotations

import torch

from wslm.backend.modeling.layers.attention import AttentionMetadata
from wslm.backend.platforms.cpu.decode_eager import CpuDecodePath
from wslm.backend.platforms.cpu.tuning import SMALL_STEP_ROWS, one_thread_when


class CpuDecodePlan:
    def __init__(self, eager: CpuDecodePath, native=None) -> None:
        self.eager = eager
        self.native = native  # NativeDecode, where the C kernels take this model
        self.compiled = None  # CompiledDecode, once enable_compile() built it
        self._order: dict[int, tuple] = {}

    @classmethod
    def build(cls, model, kv_pool: torch.Tensor) -> CpuDecodePlan | None:
        """None when the model is not one the fast steps take (its own forward serves every step)."""
        eager = CpuDecodePath.build(model, kv_pool)
        if eager is None:
            return None
        from wslm.backend.platforms.cpu.decode_native import NativeDecode

        return cls(eager, NativeDecode.build(model, kv_pool))

    def enable_compile(self, model, kv_pool: torch.Tensor, enforce_eager: bool) -> None:
        """Compile the step in the background; eager serves until it is ready."""
        from wslm.backend.platforms.cpu.decode_compiled import CompiledDecode

        # One sequence's steps run in C where C takes them: then no graph (nor its weight copy) for those,
        # and the batch graph compiles when the first batch comes, or when start_compile() asks (the server,
        # once ready): offline, a lone chat never shares the cores (and the GIL) with inductor.
        single = self.native is None
        self.compiled = CompiledDecode.build(model, kv_pool, enforce_eager, single)
        if self.compiled is not None and single:
            self.compiled.start()
        self._order.clear()

    def start_compile(self) -> None:
        """Compile the batch graph now instead of at the first batch: a server does once it is ready, so
        that its first concurrent requests do not wait a minute at eager speed for the compile to begin."""
        if self.compiled is not None:
            self.compiled.start()

    def backends(self, n: int) -> tuple:
        """The back ends offered a decode step of n sequences, in order (decided once per n)."""
        order = self._order.get(n)
        if order is None:
            order = tuple(b for b in (self.native if n == 1 else None, self.compiled, self.eager) if b is not None)
            if n > 1 and self.compiled is not None:
                self.compiled.start()  # the batch graph, at the first batch (see enable_compile)
            self._order[n] = order
        return order

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor | None:
        n = input_ids.shape[0]
        if n > 1 and self.native is not None:  # a lone chat's speculative rows: C too (decode_rows.py)
            from wslm.backend.platforms.cpu.decode_rows import run_rows

            logits = run_rows(self.native, input_ids, positions, meta)
            if logits is not None:
                if self.compiled is not None:
                    self.compiled.hold()
                return logits
        for backend in self.backends(n):
            if backend is self.native:  # it measures which thread count serves it best (StepThreads)
                logits = backend.run(input_ids, positions, meta)
                if logits is not None and self.compiled is not None:
                    self.compiled.hold()  # a lone chat needs no graph: the compile waits while it is served
            else:
                with one_thread_when(n <= SMALL_STEP_ROWS):
                    logits = backend.run(input_ids, positions, meta)
                if logits is not None and backend is self.eager and self.compiled is not None:
                    # A batch served eagerly while the graph compiles: inductor's Python shares the GIL with
                    # every eager op, and beside it a batch ran at 0.14x its eager speed (2-core Zen 4,
                    # bench/batch_during_compile.py). The compile waits; it goes on when the steps pause.
                    self.compiled.hold()
            if logits is not None:
                return logits
        return None

    def set_native(self, native) -> None:
        """Replace (or, with None, turn off) the C step: tests compare the others on the same inputs."""
        self.native = native
        self._order.clear()

    def weights_updated(self) -> None:
        """The weights were replaced after loading: bind again; the compiled graph froze the old ones."""
        self.eager.rebind()
        if self.native is not None and not self.native.rebind():
            self.native = None
        if self.compiled is not None:
            self.compiled.drop()
            self.compiled = None
        self._order.clear()
