"""One sequence's decode step on CPU in a single C call (wslm/kernels/cpu_layer.c).

A lone chat (the desktop app's everyday case) decodes one token at a time, and on CPU that step is
mostly overhead: the demo model's int4 products take ~3.5 ms a token on one core, while ~20 torch ops a
layer (cpu_decode.py) or inductor's graph (cpu_compiled.py) add 5-7 ms of dispatch and cold caches. Here
every layer runs in one C loop over the weights in place (torch's int4 pack, int8 rows or dense), the
embedding lookup, final norm and head staying in torch. It covers the models and weights the eager fast
path covers, in bfloat16 or float32 (what dtype=auto picks on CPUs without bf16 arithmetic, where the
int4/int8 products still take bf16 rows, as in torch) with a KV cache of the model's dtype; anything else
keeps the other paths.
WSLM_CPU_NATIVE_DECODE=0 turns it off (WSLM_CPU_KERNELS=0 too, with the rest of the C kernels).

Results follow cpu_decode.py's op for op in the model's dtype, with the same int4 and int8 kernels (the
int4 one rounds the activation row to int8 per 32 columns where the CPU has AVX2 or AVX512-VNNI, as
llama.cpp does; so does the eager path's, cpu_gemv.int4_q8()); attention and the norms sum in another
order, so logits agree to the dtype's rounding and greedy tokens may branch on a near-tie after a while,
as the compiled path's do (tests/test_cpu_native.py)."""

from __future__ import annotations

import ctypes
import logging
import time

import torch

from wslm import envs
from wslm.backend.modeling.layers.attention import AttentionMetadata
from wslm.backend.platforms.cpu.tuning import StepThreads, torch_threads
from wslm.kernels import cpu_gemv
from wslm.kernels.torch_rotary import _cos_sin

logger = logging.getLogger(__name__)
ENV_VAR = "WSLM_CPU_NATIVE_DECODE"
INT4, INT8, BF16, F32, GGUF = 1, 2, 3, 4, 5  # cpu_layer.c's weight kinds
_QUANT = {"int4": INT4, "int8": INT8, "gguf": GGUF}  # the kinds of quantized weights' c_view
_DENSE = {torch.bfloat16: BF16, torch.float32: F32}


class _Linear(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int64), ("w", ctypes.c_void_p), ("scales", ctypes.c_void_p),
                ("bias", ctypes.c_void_p), ("n", ctypes.c_int64), ("k", ctypes.c_int64),
                ("group", ctypes.c_int64), ("block", ctypes.c_int64)]  # fmt: skip


class _LayerC(ctypes.Structure):
    _fields_ = [("w_in", ctypes.c_void_p), ("w_post", ctypes.c_void_p), ("qk_norm", ctypes.c_void_p),
                ("eps_in", ctypes.c_double), ("eps_post", ctypes.c_double), ("qk_eps", ctypes.c_double),
                ("scale", ctypes.c_double), ("qkv", _Linear), ("o", _Linear), ("gate_up", _Linear),
                ("down", _Linear), ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p)]  # fmt: skip


def _plain(t: torch.Tensor | None, dtype: torch.dtype) -> bool:
    return t is None or (t.dtype == dtype and t.is_contiguous() and t.device.type == "cpu")


def _linear(fn, dtype: torch.dtype) -> tuple[_Linear, list[torch.Tensor]] | str:
    """The C view of one of cpu_decode's bound linears for activations of dtype (what it holds kept alive
    beside it), or why not."""
    w, bias = getattr(fn, "source_weight", None), getattr(fn, "source_bias", None)
    if w is None or not _plain(bias, dtype):
        return "a linear layer of another kind or a bias in another dtype"
    c_view = getattr(w, "c_view", None)  # quant.registry.QuantizedWeight's hook
    if c_view is not None:
        view = c_view()
        if isinstance(view, str):
            return view
        spec = (_QUANT[view[0]], *view[1:])
    elif isinstance(w, torch.Tensor) and _plain(w, dtype) and w.dim() == 2:
        spec = (_DENSE[dtype], w, None, 0, w.shape[0], w.shape[1], 0)
    else:
        return f"{type(w).__name__} weights ({getattr(w, 'dtype', 'packed')})"
    kind, main, scales, group, n, k, block = spec
    keep = [t for t in (main, scales, bias) if t is not None]
    # GGUF blocks: main is the C struct of the weight's parts (kernels/cpu_gguf.py), read in place
    ptr = [None if t is None else ctypes.addressof(t) if isinstance(t, ctypes.Structure) else t.data_ptr()
           for t in (main, scales, bias)]  # fmt: skip
    return _Linear(kind, ptr[0], ptr[1], ptr[2], n, k, group, block), keep


def why_not(cpu_decode, kv_pool: torch.Tensor) -> str | None:
    """None when one-sequence decode steps can run in C here; else the reason they cannot."""
    if not envs.get(ENV_VAR):
        return f"{ENV_VAR}=0"
    if cpu_decode is None:
        return "the model does not take the CPU fast decode path"
    dtype = cpu_decode.model.dtype
    if dtype not in _DENSE or kv_pool.dtype != dtype:
        return f"a {dtype} model with a {kv_pool.dtype} KV cache (bfloat16 or float32, both alike, run here)"
    if cpu_gemv.library() is None:
        return "the C kernels are not built here"
    for layer in cpu_decode.layers:
        if layer.mlp is not None:
            return "a mixture-of-experts or other MLP block"
        if layer.heads % layer.kv_heads or layer.heads // layer.kv_heads > 64 or layer.head_dim % 2:
            return "head layout"
        if not all(_plain(t, dtype) for t in (layer.w_in, layer.w_post, layer.qk_norm_w)):
            return "norm weights not contiguous in the model's dtype"
        for fn in (layer.qkv, layer.o, layer.gate_up, layer.down):
            spec = _linear(fn, dtype)
            if isinstance(spec, str):
                return spec
    return None


class NativeDecode:
    """run() is the logits of a one-sequence decode step, or None for anything else."""

    def __init__(self, cpu_decode, kv_pool: torch.Tensor) -> None:
        self.cpu_decode = cpu_decode
        self.kv_pool = kv_pool  # [layers, k|v, blocks, block_size, kv_heads, head_dim]
        self.lib = cpu_gemv.library()
        self.dtype = cpu_decode.model.dtype
        fn = self.lib.wslm_decode_row if self.dtype == torch.bfloat16 else self.lib.wslm_decode_row_f32
        self.step_fn = fn
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 5 + [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 3 + [
            ctypes.c_int]  # fmt: skip
        rows = self.lib.wslm_decode_rows if self.dtype == torch.bfloat16 else self.lib.wslm_decode_rows_f32
        rows.restype = ctypes.c_int
        rows.argtypes = fn.argtypes[:13] + [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
        self.rows_fn = rows  # several rows of one sequence (decode_rows.py)
        self._bind()
        self.steps = 0
        self.threads = StepThreads()
        self.fixed_threads = envs.WSLM_CPU_STEP_THREADS  # read once: not an environment lookup a step

    @classmethod
    def build(cls, cpu_decode, kv_pool: torch.Tensor) -> NativeDecode | None:
        reason = why_not(cpu_decode, kv_pool)
        if reason is not None:
            logger.info("one-sequence CPU decode not in C: %s", reason)
            return None
        return cls(cpu_decode, kv_pool)

    def rebind(self) -> bool:
        """After cpu_decode.rebind() (weights replaced): the C structs again; False when the new weights are
        not for this path (then the runner drops it)."""
        if why_not(self.cpu_decode, self.kv_pool) is not None:
            return False
        self._bind()
        return True

    def _bind(self) -> None:
        """The C structs for the layers cpu_decode has bound now (and the tensors they point into)."""
        layers = self.cpu_decode.layers
        self.keep: list[torch.Tensor] = []
        arr = (_LayerC * len(layers))()
        for i, layer in enumerate(layers):
            c = arr[i]
            linears = []
            for fn in (layer.qkv, layer.o, layer.gate_up, layer.down):
                lin, keep = _linear(fn, self.dtype)
                linears.append(lin)
                self.keep += keep
            c.qkv, c.o, c.gate_up, c.down = linears
            c.w_in, c.w_post = layer.w_in.data_ptr(), layer.w_post.data_ptr()
            c.eps_in, c.eps_post, c.scale = layer.eps_in, layer.eps_post, layer.scale
            if layer.qk_norm_w is not None:
                c.qk_norm, c.qk_eps = layer.qk_norm_w.data_ptr(), layer.qk_eps
            c.k_cache, c.v_cache = self.kv_pool[i, 0].data_ptr(), self.kv_pool[i, 1].data_ptr()
            self.keep += [layer.w_in, layer.w_post] + (
                [layer.qk_norm_w] if layer.qk_norm_w is not None else []
            )
        self.layers = arr
        first = layers[0]
        self.dims = (first.heads, first.kv_heads, first.head_dim)

    @torch.inference_mode()
    def run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, threads: int | None = None
    ) -> torch.Tensor | None:
        """threads: how many the step and the head run on; by default what StepThreads measured faster."""
        if input_ids.shape[0] != 1 or meta.block_tables.dtype != torch.int32:
            return None
        slot = int(meta.slot_mapping[0])
        if slot < 0:
            return None
        cpu = self.cpu_decode
        model = cpu.model
        hidden = model.embed(input_ids).to(self.dtype).contiguous().clone()
        residual = torch.empty_like(hidden)
        cos2, sin2 = (t.contiguous() for t in _cos_sin(positions, cpu.table, self.dtype, True)[2:])
        table = meta.block_tables[0].contiguous()
        heads, kv_heads, head_dim = self.dims
        most = torch.get_num_threads()
        fixed = self.fixed_threads
        chosen = threads is None and not fixed
        if chosen:
            threads = self.threads.pick(most)
        elif threads is None:
            threads = min(fixed, most)
        start = time.perf_counter()
        with torch_threads(threads):  # the head after the step runs on as many
            rc = self.step_fn(
                ctypes.addressof(self.layers), len(self.layers), hidden.shape[-1], heads, kv_heads, head_dim,
                hidden.data_ptr(), residual.data_ptr(), cos2.data_ptr(), sin2.data_ptr(), table.data_ptr(),
                cpu.block_size, int(meta.seq_lens[0]), slot, threads,
            )  # fmt: skip
            if rc == -1:
                raise MemoryError("wslm_decode_row: out of memory for a decode step's buffers")
            if rc != 0:
                raise RuntimeError(f"wslm_decode_row failed ({rc})")
            logits = model.compute_logits(model.norm(hidden + residual))
        if chosen:
            self.threads.record(threads, time.perf_counter() - start)
        self.steps += 1
        return logits
