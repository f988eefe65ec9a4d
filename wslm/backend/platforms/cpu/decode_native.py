"""One sequence's decode step on CPU in a single C call (wslm/kernels/cpu_layer.c).

A lone chat (the desktop app's everyday case) decodes one token at a time, and on CPU that step is
mostly overhead: the demo model's int4 products take ~3.5 ms a token on one core, while ~20 torch ops a
layer (decode_eager.py) or inductor's graph (decode_compiled.py) add 5-7 ms of dispatch and cold caches. Here
every layer runs in one C loop over the weights in place (torch's int4 pack, int8 rows or dense), the
embedding lookup, final norm and head staying in torch. It covers the models and weights the eager fast
path covers, in bfloat16 or float32 (what dtype=auto picks on CPUs without bf16 arithmetic, where the
int4/int8 products still take bf16 rows, as in torch) with a KV cache of the model's dtype; anything else
keeps the other paths.
WSLM_CPU_NATIVE_DECODE=0 turns it off (WSLM_CPU_KERNELS=0 too, with the rest of the C kernels).

The layers are the family's `decode_layers()` specs (decode_specs.py) and each weight is passed to C as its
kernel description says (quant/kernel.py: dense rows, int8 rows, torch's int4 pack, GGUF blocks); the C loop
(cpu_layer.c) is the layer's math, assembled per layer from those.

Results follow decode_eager.py's op for op in the model's dtype, with the same int4 and int8 kernels (the
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
from wslm.backend.modeling.layers.decode_spec import DecodeLayer
from wslm.backend.platforms.cpu.decode_specs import NOT_FAST, decode_specs, kernel_of, linears, qk_norm_weight
from wslm.backend.platforms.cpu.tuning import StepThreads, torch_threads
from wslm.kernels import cpu_gemv
from wslm.kernels.torch_rotary import _cos_sin

logger = logging.getLogger(__name__)
ENV_VAR = "WSLM_CPU_NATIVE_DECODE"
INT4, INT8, BF16, F32, GGUF = 1, 2, 3, 4, 5  # cpu_layer.c's weight kinds
_QUANT = {"int4": INT4, "int8": INT8, "gguf": GGUF}  # quant/kernel.py layouts -> cpu_layer.c's kinds
_DENSE = {torch.bfloat16: BF16, torch.float32: F32}
# Each layout's buffers in cpu_layer.c's order: (the weight, its scales)
_BUFFERS = {"dense": ("weight", None), "int8": ("qweight", "scales"), "int4": ("packed", "scales_and_zeros"),
            "gguf": ("blocks", None)}  # fmt: skip


class _Linear(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int64), ("w", ctypes.c_void_p), ("scales", ctypes.c_void_p),
                ("bias", ctypes.c_void_p), ("n", ctypes.c_int64), ("k", ctypes.c_int64),
                ("group", ctypes.c_int64), ("block", ctypes.c_int64)]  # fmt: skip


class _MoeC(ctypes.Structure):
    _fields_ = [("router", _Linear), ("gate_up", ctypes.POINTER(_Linear)), ("down", ctypes.POINTER(_Linear)),
                ("experts", ctypes.c_int64), ("top_k", ctypes.c_int64), ("norm_topk", ctypes.c_int64)]  # fmt: skip


class _LayerC(ctypes.Structure):
    _fields_ = [("w_in", ctypes.c_void_p), ("w_post", ctypes.c_void_p), ("qk_norm", ctypes.c_void_p),
                ("eps_in", ctypes.c_double), ("eps_post", ctypes.c_double), ("qk_eps", ctypes.c_double),
                ("scale", ctypes.c_double), ("qkv", _Linear), ("o", _Linear), ("gate_up", _Linear),
                ("down", _Linear), ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p),
                ("moe", ctypes.POINTER(_MoeC))]  # fmt: skip


class _Weight:
    """An expert's weight as a linear layer (what _linear reads: .weight, .bias)."""

    __slots__ = ("weight", "bias")

    def __init__(self, weight) -> None:
        self.weight, self.bias = weight, None


def _experts_why_not(moe, dtype: torch.dtype) -> str | None:
    """None when the C step computes this mixture of experts (layers/moe.FusedMoE) itself; else why not."""
    from wslm.backend.distributed.parallel_state import get_tp_size
    from wslm.backend.modeling.layers.activation import silu_and_mul

    if get_tp_size() != 1 or moe.act_and_mul is not silu_and_mul or not isinstance(moe.w13, list):
        return "a mixture of experts other than SiLU-gated quantized experts on one device"
    if not 1 <= moe.top_k <= min(64, moe.num_experts):
        return "a mixture of experts with that many experts a token"
    for layer in (moe.gate, *map(_Weight, moe.w13), *map(_Weight, moe.w2)):
        view = _linear(layer, dtype)
        if isinstance(view, str):
            return f"experts: {view}"
    return None


def _moe_struct(moe, dtype: torch.dtype) -> tuple[_MoeC, list]:
    """The C view of a mixture of experts, with what it points into."""
    keep: list = []
    views = {}
    for name, weights in (("gate_up", moe.w13), ("down", moe.w2)):
        arr = (_Linear * len(weights))()
        for e, w in enumerate(weights):
            arr[e], k = _linear(_Weight(w), dtype)
            keep += k
        views[name] = arr
    router, k = _linear(moe.gate, dtype)
    keep += k + list(views.values())
    c = _MoeC(router, views["gate_up"], views["down"], moe.num_experts, moe.top_k, int(bool(moe.norm_topk_prob)))
    return c, keep


def _plain(t: torch.Tensor | None, dtype: torch.dtype) -> bool:
    return t is None or (t.dtype == dtype and t.is_contiguous() and t.device.type == "cpu")


def _linear(layer, dtype: torch.dtype) -> tuple[_Linear, list] | str:
    """The C view of a linear layer for activations of dtype, built from its weight's kernel description
    (quant/kernel.py), with what it points into (kept alive beside it); or why not."""
    bias = layer.bias
    if not _plain(bias, dtype):
        return "a bias in another dtype"
    k = kernel_of(layer)
    if isinstance(k, str):
        return k
    if k.layout not in _BUFFERS or "perm" in k.buffers:
        return f"{k.layout} weights with a layout the C step does not read"
    if k.layout == "dense" and k.dtype != dtype:
        return f"dense {k.dtype} weights in a {dtype} model"
    tensors = [t for t in k.buffers.values() if isinstance(t, torch.Tensor)]
    if not k.c_kernel or not all(t.is_contiguous() for t in tensors):
        return f"{k.layout} weights the C kernels do not read here"
    kind = _DENSE[dtype] if k.layout == "dense" else _QUANT[k.layout]
    main, scales = (None if name is None else k.buffers[name] for name in _BUFFERS[k.layout])
    keep = [t for t in (main, scales, bias) if t is not None]
    # GGUF blocks: main is the C struct of the weight's parts (kernels/cpu_gguf.py), read in place
    ptr = [None if t is None else ctypes.addressof(t) if isinstance(t, ctypes.Structure) else t.data_ptr()
           for t in (main, scales, bias)]  # fmt: skip
    return _Linear(kind, ptr[0], ptr[1], ptr[2], k.n, k.k, k.group, k.block), keep


def _specs(model, kv_pool: torch.Tensor) -> list[DecodeLayer] | str:
    """The model's layers as its family describes them (decode_specs.py), or why they cannot run in C."""
    if not envs.get(ENV_VAR):
        return f"{ENV_VAR}=0"
    if model is None:
        return NOT_FAST
    specs = decode_specs(model, kv_pool)
    if isinstance(specs, str):
        return f"{NOT_FAST} ({specs})"
    dtype = model.dtype
    if dtype not in _DENSE or kv_pool.dtype != dtype:
        return f"a {dtype} model with a {kv_pool.dtype} KV cache (bfloat16 or float32, both alike, run here)"
    if cpu_gemv.library() is None:
        return "the C kernels are not built here"
    for spec in specs:
        if spec.mlp is not None and spec.experts is None:
            return "an MLP block of its own (a shared expert, another activation)"
        if spec.experts is not None:
            why = _experts_why_not(spec.experts, dtype)
            if why:
                return why
        if spec.heads % spec.kv_heads or spec.heads // spec.kv_heads > 64 or spec.head_dim % 2:
            return "head layout"
        if not all(_plain(t, dtype) for t in (spec.input_norm.weight, spec.post_norm.weight, qk_norm_weight(spec))):
            return "norm weights not contiguous in the model's dtype"
        for layer in linears(spec):
            view = None if layer is None else _linear(layer, dtype)  # None: the experts' MLP
            if isinstance(view, str):
                return view
    return specs


def why_not(model, kv_pool: torch.Tensor) -> str | None:
    """None when one-sequence decode steps can run in C here; else the reason they cannot."""
    specs = _specs(model, kv_pool)
    return specs if isinstance(specs, str) else None


class NativeDecode:
    """run() is the logits of a one-sequence decode step, or None for anything else."""

    def __init__(self, model, kv_pool: torch.Tensor, specs: list[DecodeLayer]) -> None:
        self.model = model
        self.kv_pool = kv_pool  # [layers, k|v, blocks, block_size, kv_heads, head_dim]
        self.block_size = kv_pool.shape[3]
        self.lib = cpu_gemv.library()
        self.dtype = model.dtype
        fn = self.lib.wslm_decode_row if self.dtype == torch.bfloat16 else self.lib.wslm_decode_row_f32
        self.step_fn = fn
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 5 + [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 3 + [
            ctypes.c_int]  # fmt: skip
        rows = self.lib.wslm_decode_rows if self.dtype == torch.bfloat16 else self.lib.wslm_decode_rows_f32
        rows.restype = ctypes.c_int
        rows.argtypes = fn.argtypes[:11] + [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 2 + [ctypes.c_int64, ctypes.c_int]
        self.rows_fn = rows  # several decode rows, of one sequence or of several (decode_rows.py)
        self._bind(specs)
        self.steps = 0
        self.threads = StepThreads()
        self.fixed_threads = envs.WSLM_CPU_STEP_THREADS  # read once: not an environment lookup a step

    @classmethod
    def build(cls, model, kv_pool: torch.Tensor) -> NativeDecode | None:
        specs = _specs(model, kv_pool)
        if isinstance(specs, str):
            logger.info("one-sequence CPU decode not in C: %s", specs)
            return None
        return cls(model, kv_pool, specs)

    def rebind(self) -> bool:
        """After the weights were replaced: the C structs again; False when the new weights are not for this
        path (then the plan drops it)."""
        specs = _specs(self.model, self.kv_pool)
        if isinstance(specs, str):
            return False
        self._bind(specs)
        return True

    def _bind(self, specs: list[DecodeLayer]) -> None:
        """The C structs of the layers the family describes (and the tensors they point into)."""
        self.keep: list = []
        arr = (_LayerC * len(specs))()
        for i, spec in enumerate(specs):
            c = arr[i]
            views = []
            for layer in linears(spec):
                lin, keep = (_Linear(), []) if layer is None else _linear(layer, self.dtype)
                views.append(lin)
                self.keep += keep
            c.qkv, c.o, c.gate_up, c.down = views
            w_in, w_post, qk_norm = spec.input_norm.weight, spec.post_norm.weight, qk_norm_weight(spec)
            c.w_in, c.w_post = w_in.data_ptr(), w_post.data_ptr()
            c.eps_in, c.eps_post, c.scale = spec.input_norm.eps, spec.post_norm.eps, spec.scale
            if qk_norm is not None:
                c.qk_norm, c.qk_eps = qk_norm.data_ptr(), spec.q_norm.norm.eps
            c.k_cache, c.v_cache = self.kv_pool[i, 0].data_ptr(), self.kv_pool[i, 1].data_ptr()
            self.keep += [w_in, w_post] + ([qk_norm] if qk_norm is not None else [])
            if spec.experts is not None:
                moe, keep = _moe_struct(spec.experts, self.dtype)
                c.moe = ctypes.pointer(moe)
                self.keep += [moe, keep]
        self.layers = arr
        # a step of several rows (decode_rows.py) does not take experts: those rows go another way
        self.has_moe = any(spec.experts is not None for spec in specs)
        first = specs[0]
        self.dims = (first.heads, first.kv_heads, first.head_dim)
        self.table = first.cos_sin_cache  # neox rotary, shared by every layer (decode_layers checks)

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
        model = self.model
        hidden = model.embed(input_ids).to(self.dtype).contiguous().clone()
        residual = torch.empty_like(hidden)
        cos2, sin2 = (t.contiguous() for t in _cos_sin(positions, self.table, self.dtype, True)[2:])
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
                self.block_size, int(meta.seq_lens[0]), slot, threads,
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
