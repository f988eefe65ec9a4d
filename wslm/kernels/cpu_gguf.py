"""GGUF block weights multiplied in place on CPU: cpu_gguf.c, built into cpu_gemv's library (cpu_gemv.py
builds, caches and loads it; WSLM_CPU_KERNELS=0 turns it off with the rest).

The activation rows are rounded to int8 per block (llama.cpp's Q8_0 for the 32-column types, Q8_K for the
K-quants) and each weight block's dot product is integer arithmetic; round_x gives a row as the kernel
sees it (tests compare against dequantize(W) @ round_x(x))."""

from __future__ import annotations

import ctypes
import threading

import torch

from wslm.kernels import cpu_gemv, cpu_gguf_gemm

PARTS = 4  # cpu_gguf.c's GGUF_PARTS
_lock = threading.Lock()
_bound: ctypes.CDLL | None = None


class GGUFStruct(ctypes.Structure):
    _fields_ = [("parts", ctypes.c_int64), ("type", ctypes.c_int64 * PARTS), ("data", ctypes.c_void_p * PARTS),
                ("rows", ctypes.c_int64 * PARTS), ("index", ctypes.c_void_p), ("n", ctypes.c_int64),
                ("k", ctypes.c_int64)]  # fmt: skip


def library() -> ctypes.CDLL | None:
    """cpu_gemv's library with this file's entry points typed, or None where it is not built."""
    global _bound
    if _bound is not None:
        return _bound
    lib = cpu_gemv.library()
    if lib is None:
        return None
    with _lock:
        lib.wslm_gguf_mm.restype = ctypes.c_int
        lib.wslm_gguf_mm.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_void_p,
                                     ctypes.c_int, ctypes.c_int]  # fmt: skip
        lib.wslm_gguf_takes.restype = ctypes.c_int
        lib.wslm_gguf_takes.argtypes = [ctypes.c_long]
        lib.wslm_gguf_round_x.restype = None
        lib.wslm_gguf_round_x.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p]
        lib.wslm_gguf_native.restype = ctypes.c_int
        lib.wslm_gguf_dequant.restype = ctypes.c_int
        lib.wslm_gguf_dequant.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_int]
        _bound = lib
    return lib


def takes(weight) -> bool:
    """Whether the kernels are built here and take every part of weight (a GGUFBlockWeight on CPU)."""
    lib = library()
    return (
        lib is not None and len(weight.parts) <= PARTS
        and all(raw.device.type == "cpu" and raw.is_contiguous() and lib.wslm_gguf_takes(t) for t, raw in weight.parts)
    )  # fmt: skip


def struct_for(weight) -> GGUFStruct:
    """The C view of a GGUFBlockWeight; it keeps the tensors it points into alive (as _keep)."""
    s = GGUFStruct()
    s.parts = len(weight.parts)
    for i, (t, raw) in enumerate(weight.parts):
        s.type[i], s.data[i], s.rows[i] = t, raw.data_ptr(), raw.shape[0]
    index = None if weight.index is None else weight.index.to(torch.int32).contiguous()
    s.index = None if index is None else index.data_ptr()
    s.n, s.k = weight.out_features, weight.in_features
    s._keep = (weight.parts, index)
    return s


def mm(x: torch.Tensor, s: GGUFStruct, out_dtype: torch.dtype | None = None, threads: int | None = None
       ) -> torch.Tensor:  # fmt: skip
    """x [M, K] (bf16 or float32, contiguous) @ W.T -> [M, N] in out_dtype (bf16 or float32; None: x's)."""
    m = x.shape[0]
    if m >= cpu_gguf_gemm.MIN_ROWS and cpu_gguf_gemm.takes(s):  # prefill: the tiled GEMM (cpu_gguf_gemm.c)
        return cpu_gguf_gemm.mm(x, s, out_dtype, threads)
    out = torch.empty(m, s.n, dtype=out_dtype or x.dtype)
    rc = (_bound or library()).wslm_gguf_mm(ctypes.addressof(s), x.data_ptr(), m, int(x.dtype == torch.bfloat16), out.data_ptr(),
                             int(out.dtype == torch.bfloat16),
                             threads or torch.get_num_threads())  # fmt: skip
    if rc == -1:
        raise MemoryError("wslm_gguf_mm: out of memory for the activations' int8 copy")
    if rc != 0:
        raise RuntimeError(f"wslm_gguf_mm failed ({rc}): a block type or width the kernel does not take")
    return out


def dequant(s: GGUFStruct, n0: int, n1: int, threads: int | None = None) -> torch.Tensor:
    """Stored rows [n0, n1) of the weight as float32 [n1 - n0, K] (the file's values; in stored order)."""
    out = torch.empty(n1 - n0, s.k, dtype=torch.float32)
    library().wslm_gguf_dequant(ctypes.addressof(s), n0, n1, out.data_ptr(), threads or torch.get_num_threads())
    return out


def round_x(x: torch.Tensor, block_cols: int) -> torch.Tensor:
    """A float32 row [K] as the kernel sees it for blocks of block_cols columns (32, or 256 for K-quants)."""
    lib = library()
    x = x.float().contiguous()
    y = torch.empty_like(x)
    lib.wslm_gguf_round_x(x.data_ptr(), x.numel(), block_cols, y.data_ptr())
    return y


def native() -> int:
    """256 where the block dot products run AVX2 loops here, 0 where they run the plain ones."""
    lib = library()
    return 0 if lib is None else int(lib.wslm_gguf_native())
