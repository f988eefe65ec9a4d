"""The CPU decode step compiled by torch.compile (inductor), where a C++ compiler exists.

The eager fast path (decode_eager.py) still pays ~20 op dispatches per layer, and torch's int4/int8 CPU
kernels run one matrix-vector product per batch row. Compiled with frozen weights and max-autotune,
inductor fuses the small ops into a few C++ loops and picks its own WoQ GEMM micro-kernels (AVX-512 at one
row, AMX from a few rows where the CPU has it) whenever they beat the aten kernels; on CPUs without AMX
its int4 products call torch's one-row-at-a-time kernel, so the graph calls cpu_gemv's multi-row kernel
instead (a custom op). Measured on the demo GGUF (2-core Xeon with AMX): one sequence 13.8 -> 8.8 ms a
step on one core, 32 sequences 70 -> 24 ms on two (docs/benchmarks.md).

Compiling takes ~2 minutes per graph on 2 cores with a cold inductor cache (~30 s warm), so it runs in a
background thread at start: steps run the eager fast path until the graphs (one sequence, unless
decode_native.py runs those steps in C; 2+ sequences, shapes dynamic) are ready, then switch. While a lone
chat or a batch is served without the graph, the compile pauses (hold()): sharing the GIL and the cores with
it cost a lone chat two thirds of its speed and a batch six sevenths; it goes on when the steps pause.
Any failure (no compiler, an inductor error) is logged once and the eager path keeps serving.

The graph reads the KV pool but never writes it: each layer's new key/value are put into its gathered
copy for attention and returned, and one index_copy_ after the graph stores every layer's at once (a
graph that mutated the pool could make inductor copy the whole pool each step). Off with --enforce-eager
or WSLM_CPU_COMPILE=0; results match the eager path to bf16 rounding (not bit for bit: other kernels)."""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import sys
import threading
import time
import weakref

import torch
import torch.nn.functional as F

from wslm import envs
from wslm.backend.modeling.layers.attention import AttentionMetadata
from wslm.backend.modeling.layers.decode_spec import DecodeLayer
from wslm.backend.platforms.cpu.decode_math import attend, attention_in, attention_out_and_mlp, gated_mlp
from wslm.backend.platforms.cpu.decode_specs import (
    NOT_FAST,
    bias_after,
    decode_specs,
    linears,
    qk_norm_weight,
)
from wslm.backend.platforms.cpu.server_memory import AUTO_MAX_WEIGHT_BYTES, has_cxx_compiler
from wslm.backend.platforms.cpu.thread_pause import ThreadPause
from wslm.backend.quant.kernel import WeightKernel, weight_kernel
from wslm.kernels import cpu_gemv
from wslm.kernels.torch_paged_attention import _decode_blocks
from wslm.kernels.torch_rotary import _cos_sin

logger = logging.getLogger(__name__)
ENV_VAR = "WSLM_CPU_COMPILE"


# By default only models up to AUTO_MAX_WEIGHT_BYTES compile: each graph keeps its own repacked copy of
# the weights (measured ~0.9x the weights per graph, two graphs), which small models afford and which
# matters most for them (their steps are overhead, not bandwidth). WSLM_CPU_COMPILE=1 compiles any size.
# (server_memory.py holds the rule, which `wslm models` memory estimates count with.)
# How long exit waits for a cancelled compile to stop (it stops at its next Python line; a C++ compiler
# run under way finishes first).
_CANCEL_WAIT_S = 60.0
# A compile paused for a lone chat (hold()) resumes once no lone step came for this long.
_HOLD_S = 0.2


class _Cancelled(BaseException):
    """Raised inside the compile thread by cancel(); a BaseException, so no `except Exception` in torch
    turns it into a failed (logged) compile."""


_running: weakref.WeakSet[CompiledDecode] = weakref.WeakSet()  # compiles whose thread is under way


def _cancel_at_exit() -> None:
    for compiled in list(_running):
        compiled.cancel()


# Before the atexit handlers, which the compile's own modules register (inductor's, dynamo's) and which
# tear down what a running compile uses: threading's exit hooks run first (concurrent.futures uses them).
try:
    threading._register_atexit(_cancel_at_exit)  # type: ignore[attr-defined]
except (AttributeError, RuntimeError):  # another Python; or imported while the interpreter exits
    atexit.register(_cancel_at_exit)


def why_not(model, kv_pool: torch.Tensor | None = None, enforce_eager: bool = False,
            weight_bytes: int = 0) -> str | None:
    """None when the decode step of this model can be compiled here; else why not."""
    specs = _specs(model, kv_pool, enforce_eager, weight_bytes)
    return specs if isinstance(specs, str) else None


def _specs(model, kv_pool, enforce_eager: bool = False, weight_bytes: int = 0) -> list[DecodeLayer] | str:
    """The model's layers as its family describes them (decode_specs.py), or why the graph cannot take them."""
    setting = envs.get(ENV_VAR)  # None: auto
    if setting is False:
        return f"{ENV_VAR}={envs.raw(ENV_VAR)}"
    if enforce_eager:
        return "--enforce-eager"
    if model is None or kv_pool is None:
        return NOT_FAST
    specs = decode_specs(model, kv_pool)
    if isinstance(specs, str):
        return f"{NOT_FAST} ({specs})"
    if setting is None and weight_bytes > AUTO_MAX_WEIGHT_BYTES:
        return (f"weights of {weight_bytes / 2**30:.1f} GiB (each compiled graph keeps a copy; "
                f"{ENV_VAR}=1 compiles anyway)")  # fmt: skip
    if not has_cxx_compiler():
        return "no C++ compiler (install g++: sudo apt install g++)"
    for spec in specs:
        if spec.mlp is not None:
            return "a mixture-of-experts or other MLP block"
        for lin in linears(spec):
            if _linear_spec(lin) is None:
                return "a weight format the compiled graph does not take"
    describe = getattr(model, "decode_ends", None)
    ends = describe() if describe is not None else f"{type(model).__name__} describes no token table and head"
    if isinstance(ends, str):
        return ends
    table = _graph_kernel(ends.embed_table)
    if table is None or table.layout not in ("dense", "int8") or _weight_spec(ends.head) is None:
        return "a token table or head in a format the compiled graph does not take"
    return specs


def _linear_spec(layer) -> tuple | None:
    """(kind, tensors, extra) of a linear layer: what the graph multiplies by, as frozen buffers."""
    return _weight_spec(layer.weight, layer.bias, bias_after(layer))


def _graph_kernel(w) -> WeightKernel | None:
    """The weight's kernel description in a layout the graph reads (dense, int8, int4): GGUF blocks hand it
    their repacked form, whose kernels it was tuned with (the demo's 32 chats kept their speed), made once so
    that the graph's buffers are that one copy; lone chats and eager batches read the blocks."""
    k = weight_kernel(w)
    if not isinstance(k, str) and k.layout not in _GRAPH_LAYOUTS and k.repacked is not None:
        k = weight_kernel(k.repacked())
    return None if isinstance(k, str) or k.layout not in _GRAPH_LAYOUTS else k


_GRAPH_LAYOUTS = ("dense", "int8", "int4")


def _weight_spec(w, b=None, bias_after: bool = False) -> tuple | None:
    k = _graph_kernel(w)
    if k is None:
        return None
    if k.layout == "dense":
        return ("dense", (k.buffers["weight"], b), bias_after)
    if k.layout == "int8":
        return ("int8", (k.buffers["qweight"], k.buffers["scales"], b), None)
    sz = k.buffers["scales_and_zeros"]
    if "perm" in k.buffers or sz.dtype == torch.float32:  # act-order; float32: the eager path's exact expansion
        return None
    # cpu_gemv's int4 kernel in the graph only without AMX: with it, inductor's own int4 templates beat it
    # from a few rows; elsewhere (AVX-512 without AMX, as Zen 4; AVX2) inductor calls torch's
    # one-row-at-a-time kernel, and ours, which reads each weight block once for all rows, is 1.4-1.8x
    # faster (demo GGUF, 32 chats on a Zen 4 core: 158 tok/s compiled with torch's, 230 eager with ours).
    block = k.block if (not cpu_gemv.amx() and k.c_kernel) else 0
    return ("int4", (k.buffers["packed"], sz, b), (k.group, block))


class _DecodeModule(torch.nn.Module):
    """The eager fast path's math (decode_math.py, as decode_eager.CpuDecodePath.run runs it) over the family's
    layer specs, with every weight a buffer, so that inductor freezes them as constants."""

    def __init__(self, model, specs: list[DecodeLayer]) -> None:
        super().__init__()
        self._n = 0
        ends = model.decode_ends()  # _specs checked it
        head = ends.head
        self.embed = self._table(ends.embed_table)
        self.head = self._linear(_weight_spec(head))
        # One sequence's int8 head runs after the graph, in cpu_gemv's kernel (1.5 vs 2.6-3.5 ms on the
        # demo); a batch keeps it in the graph where the CPU has AMX (inductor's template beats both from a
        # few rows), else it runs after the graph too, as the eager path picks (inductor's int8 lowering
        # without AMX: ~52 ms for 32 rows of the demo's 49152-row head on a Zen 4 core, eager 25-28).
        self.head_after = head if _head_after(head) else None
        self.head_outside_batches = not cpu_gemv.amx()
        self.final_norm = self._buf(ends.final_norm.weight)
        self.final_eps = ends.final_norm.eps
        self.dtype = model.dtype
        self.layers = []
        for spec in specs:
            self.layers.append(
                dict(
                    w_in=self._buf(spec.input_norm.weight), w_post=self._buf(spec.post_norm.weight),
                    eps_in=spec.input_norm.eps, eps_post=spec.post_norm.eps,
                    qkv=self._linear(_linear_spec(spec.qkv_proj)), o=self._linear(_linear_spec(spec.o_proj)),
                    gate_up=self._linear(_linear_spec(spec.gate_up_proj)),
                    down=self._linear(_linear_spec(spec.down_proj)),
                    qk_norm=self._buf(qk_norm_weight(spec)),
                    qk_eps=None if spec.q_norm is None else spec.q_norm.norm.eps,
                    q_size=spec.q_size, kv_size=spec.kv_size, heads=spec.heads, kv_heads=spec.kv_heads,
                    head_dim=spec.head_dim, scale=spec.scale,
                )
            )  # fmt: skip

    def head_outside(self, b: int) -> bool:
        """Whether a step of b sequences leaves the head to head_after (the graph returns the normed hidden)."""
        return self.head_after is not None and (self.head_outside_batches or b == 1)

    def _buf(self, t: torch.Tensor | None) -> str | None:
        if t is None:
            return None
        name = f"b{self._n}"
        self._n += 1
        self.register_buffer(name, t, persistent=False)
        return name

    def _table(self, w) -> tuple:
        k = _graph_kernel(w)  # GGUF blocks: the repacked table
        if k.layout == "dense":
            return ("dense", self._buf(k.buffers["weight"]), None)
        return ("int8", self._buf(k.buffers["qweight"]), self._buf(k.buffers["scales"]))

    def _linear(self, spec: tuple) -> tuple:
        kind, tensors, extra = spec
        return (kind, tuple(self._buf(t) for t in tensors), extra)

    def _mm(self, x: torch.Tensor, lin: tuple) -> torch.Tensor:
        kind, names, extra = lin
        t = [None if n is None else getattr(self, n) for n in names]
        if kind == "dense":
            w, b = t
            return F.linear(x, w) + b if (b is not None and extra) else F.linear(x, w, b)
        xk = x.to(t[1].dtype)  # a float32 engine's activations go to the kernels' bf16 and back, as apply does
        if kind == "int4" and extra[1]:
            out = torch.ops.wslm.int4_mm_q8(xk, t[0], t[1], extra[0], extra[1])
        elif kind == "int4":
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(xk, t[0], extra[0], t[1])
        else:
            out = torch.ops.aten._weight_int8pack_mm(xk, t[0], t[1])
        out = out.to(x.dtype)
        return out if t[-1] is None else out + t[-1]

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        kind, w, s = self.embed
        if kind == "dense":
            return F.embedding(ids, getattr(self, w))
        q, scales = getattr(self, w), getattr(self, s)
        return q.index_select(0, ids).to(self.dtype) * scales.index_select(0, ids).to(self.dtype).unsqueeze(1)

    def forward(self, input_ids, cos2, sin2, blocks, mask, cur, kv_pool):
        b = input_ids.shape[0]
        span = blocks.shape[0] // b * kv_pool.shape[3]
        hidden = self._embed(input_ids)
        residual = None
        new_kv = []
        for i, p in enumerate(self.layers):
            heads, kvh, hd = p["heads"], p["kv_heads"], p["head_dim"]
            qk_norm = None if p["qk_norm"] is None else getattr(self, p["qk_norm"])
            residual, qk, v = attention_in(
                hidden, residual, getattr(self, p["w_in"]), p["eps_in"], lambda x, lin=p["qkv"]: self._mm(x, lin),
                p["q_size"], p["kv_size"], hd, kvh, qk_norm, p["qk_eps"], cos2, sin2,
            )  # fmt: skip
            kv = torch.stack((qk[:, heads:], v))
            new_kv.append(kv)
            # This layer's cached keys/values with the new token's put in (the pool itself is not written).
            g = kv_pool[i].index_select(1, blocks).view(2, b * span, kvh, hd).index_copy(1, cur, kv)
            g = g.view(2, b, span, kvh, hd).transpose(2, 3)
            out = attend(qk, g[0], g[1], heads, mask, p["scale"])
            hidden, residual = attention_out_and_mlp(
                out, residual, lambda x, lin=p["o"]: self._mm(x, lin), getattr(self, p["w_post"]), p["eps_post"],
                lambda x, gu=p["gate_up"], dn=p["down"]: gated_mlp(x, lambda y: self._mm(y, gu), lambda y: self._mm(y, dn)),
            )  # fmt: skip
        x = getattr(self, self.final_norm) * F.rms_norm(
            hidden + residual, (hidden.shape[-1],), None, self.final_eps
        )
        if self.head_outside(b):
            return x, torch.stack(new_kv)
        return self._mm(x, self.head).float(), torch.stack(new_kv)


def _head_after(head) -> bool:
    k = weight_kernel(head)
    return not isinstance(k, str) and k.layout in ("int8", "gguf") and k.c_kernel


def _weight_bytes(specs) -> int:
    if isinstance(specs, str):
        return 0
    total = 0
    for spec in specs:
        for lin in linears(spec):
            w = None if lin is None else lin.weight
            total += w.numel() * w.element_size() if isinstance(w, torch.Tensor) else getattr(w, "nbytes", 0)
    return total


class CompiledDecode:
    """Compiles in a background thread; run() returns None until the graphs are ready."""

    def __init__(self, model, specs: list[DecodeLayer], kv_pool: torch.Tensor, single: bool = True) -> None:
        self.module = _DecodeModule(model, specs).eval()
        self.single = single  # compile the one-sequence graph too (not when decode_native.py runs those steps)
        self.table = specs[0].cos_sin_cache  # neox rotary, shared by every layer (decode_layers checks)
        self.head_dim = specs[0].head_dim
        self.dropped = False  # weights replaced after the graph froze them (drop()): never used again
        self.kv_pool = kv_pool
        self.flat_pool = kv_pool.view(kv_pool.shape[0], 2, -1, *kv_pool.shape[4:])  # [L, k|v, slots, ...]
        self.block_size = kv_pool.shape[3]
        self.compiled = None
        self.ready = threading.Event()
        self.failed: str | None = None
        self.compile_seconds = 0.0
        self.threads = torch.get_num_threads()  # the engine's (OpenMP settings are per thread)
        self.steps = 0
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._done_lock = threading.Lock()
        self._done = False  # the compile thread has ended, or been told to (cancel)
        self._pause: ThreadPause | None = None  # made by the compile thread (hold())

    @classmethod
    def build(
        cls, model, kv_pool: torch.Tensor, enforce_eager: bool = False, single: bool = True
    ) -> CompiledDecode | None:
        specs = _specs(model, kv_pool, enforce_eager, _weight_bytes(decode_specs(model, kv_pool)))
        if isinstance(specs, str):
            logger.info("CPU decode runs eagerly (not compiled): %s", specs)
            return None
        return cls(model, specs, kv_pool, single)

    def drop(self) -> None:
        """The graph froze the weights it was built with: after they are replaced, eager serves."""
        self.dropped = True
        self.compiled = None

    def start(self) -> None:
        """Compile in a background thread (once; later calls do nothing)."""
        with self._start_lock:  # the server's start and the engine's first batch may both ask
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="wslm-compile", daemon=True)
            _running.add(self)
            graphs = "one-sequence and batch graphs" if self.single else "batch graph"
            logger.info("CPU decode compile started in the background (the %s; typically 1-2 minutes on 2 "
                        "cores): decode steps run eagerly until it ends", graphs)
            self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Start compiling if that has not begun, then block until the graphs are compiled (True) or
        compiling failed or timed out (False)."""
        self.start()
        self.ready.wait(timeout)
        return self.compiled is not None

    def cancel(self, timeout: float = _CANCEL_WAIT_S) -> bool:
        """Stop a compile under way and wait for its thread (True: none left running). At interpreter exit
        (atexit below): CPython ends a daemon thread that wants the GIL back after finalization began with
        pthread_exit, and one coming back from torch's C++ (a kernel, pybind11's GIL release) unwinds
        through noexcept frames there: "terminate called without an active exception", the process aborted
        (exit 134) however the program ended. The compile is Python (dynamo, inductor) between such calls, so
        an exception raised in its thread stops it within a call's time."""
        thread = self._thread
        if thread is None:
            return True
        with self._done_lock:
            if not self._done and thread.is_alive():
                self.dropped = True  # whatever it still makes is never used
                if self._pause is not None:
                    self._pause.close()  # a pause ends within _HOLD_S; the exception comes once it has
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_Cancelled))
                self._done = True  # one exception only
        thread.join(timeout)
        return not thread.is_alive()

    def hold(self) -> None:
        """A step was just served without the graph (a lone chat in C, or a batch eagerly): the compile, if
        under way, pauses at its next Python event until no such step has come for _HOLD_S. Inductor is Python
        holding the GIL and a core: beside it a served lone chat ran at a third of its speed and a batch at a
        seventh. So the graph is built in the pauses between steps; under load without pause it is not built,
        and the steps keep the eager speed."""
        pause = self._pause
        if pause is not None:
            pause.hold()

    def _run(self) -> None:
        try:
            try:
                self._compile()
            finally:
                with self._done_lock:
                    self._done = True
        except _Cancelled:  # cancel(): the process is exiting
            self.ready.set()
        finally:
            _running.discard(self)

    def _compile(self) -> None:
        start = time.monotonic()
        # Inductor is Python: at the default 5 ms GIL switch interval the serving thread waits up to 5 ms at
        # every GIL hand-back (a lone chat fell from ~170 to 10-35 tok/s while compiling); 0.2 ms bounds it.
        interval = sys.getswitchinterval()
        sys.setswitchinterval(min(interval, 0.0002))
        self._pause = ThreadPause(_HOLD_S)
        try:
            try:  # a background job: leave the cores to the steps being served
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
            except (AttributeError, OSError):
                pass
            import torch._inductor.config as inductor

            inductor.freezing = True
            inductor.max_autotune = True
            inductor.max_autotune_gemm_backends = "CPP,ATEN"
            inductor.compile_threads = 1  # in this thread: no worker processes beside a server
            compiled = torch.compile(self.module)
            # One sequence, then 2+: every later batch reuses one of the two graphs. Sizes no other
            # dimension has, so that none is taken for another (an accidental guard, a recompile). The
            # inputs are made outside inference mode, as run() makes its own (dynamo guards on it).
            from wslm.backend.platforms.cpu.tuning import SMALL_STEP_ROWS

            passive = os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE"
            for b in (1, 11) if self.single else (11,):
                # The one-sequence graph runs on one thread where the engine would (model_runner.py:
                # waking sleeping OpenMP threads costs more than they add); the batch graph on all.
                threads = 1 if (b <= SMALL_STEP_ROWS and passive) else self.threads
                inductor.cpp.threads = threads
                torch.set_num_threads(threads)  # dynamo guards on it: as the engine will run this graph
                inputs = self._inputs_for(b, blocks_per_seq=5)
                with torch.inference_mode():
                    compiled(*inputs)
            self.compiled = None if self.dropped else compiled
            self.compile_seconds = time.monotonic() - start
            logger.info(
                "CPU decode compile ended in %.1f s: decode steps now run the compiled graph", self.compile_seconds
            )
        except Exception as exc:  # an optimisation: never a reason not to serve
            self.failed = f"{type(exc).__name__}: {exc}"
            self.compile_seconds = time.monotonic() - start
            if self._done:  # cancelled (the process exits) and torch turned that into its own error
                return
            logger.warning("CPU decode compile failed after %.1f s (%s); decode keeps running eagerly.",
                           self.compile_seconds, self.failed[:500])
        finally:
            self._pause.close()
            sys.setswitchinterval(interval)
            self.ready.set()

    def _inputs_for(self, b: int, blocks_per_seq: int) -> tuple:
        """Dummy inputs of a b-sequence step reading blocks_per_seq blocks each (block 0; nothing written)."""
        dtype, head_dim = self.module.dtype, self.head_dim
        ids = torch.zeros(b, dtype=torch.int64)
        cos2 = torch.ones(b, 1, head_dim, dtype=dtype)
        sin2 = torch.zeros(b, 1, head_dim, dtype=dtype)
        blocks = torch.zeros(b * blocks_per_seq, dtype=torch.int64)
        span = blocks_per_seq * self.block_size
        mask = torch.ones(b, 1, 1, span, dtype=torch.bool)
        cur = torch.arange(b, dtype=torch.int64) * span
        dynamic = [(blocks, 0), (mask, 3)] + (
            [(ids, 0), (cos2, 0), (sin2, 0), (blocks, 0), (mask, 0), (cur, 0)] if b > 1 else []
        )
        for t, dim in dynamic:
            torch._dynamo.mark_dynamic(t, dim)
        return ids, cos2, sin2, blocks, mask, cur, self.kv_pool

    def run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor | None:
        """Logits of a pure decode step through the compiled graph, or None (not ready, or a padding slot)."""
        if self.compiled is None:
            return None
        slots = meta.slot_mapping
        b, bs = input_ids.shape[0], self.block_size
        if b == 1 and not self.single:
            return None
        # At least two blocks per row: a one-block span would be a new shape (a recompile) for inductor.
        max_len = max(meta.max_seqlen_k, bs + 1)
        if -(-max_len // bs) > meta.block_tables.shape[1] or not bool((slots >= 0).all()):
            return None
        cos2, sin2 = _cos_sin(positions, self.table, self.module.dtype, True)[2:]
        blocks, mask = _decode_blocks(meta.block_tables, meta.seq_lens, max_len, bs, None)
        span = blocks.shape[0] // b * bs
        cur = torch.arange(b, dtype=torch.int64) * span + meta.seq_lens.long() - 1
        with torch.inference_mode():
            logits, new_kv = self.compiled(input_ids, cos2, sin2, blocks, mask, cur, self.kv_pool)
            self.flat_pool.index_copy_(2, slots, new_kv)
            if self.module.head_outside(b):
                logits = self.module.head_after.apply(logits).float()
        self.steps += 1
        return logits
