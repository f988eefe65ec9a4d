"""GGUF block weights times many activation rows on CPU: cpu_gguf_gemm.c, built into cpu_gemv's library.

For prefill (and big batches) a chunk of weight rows is unpacked once into a cached panel and every activation
row meets it in register tiles, each row rounded to int8 as cpu_gguf.c's block kernels round it; so a row's
result equals cpu_gguf.mm's within float32 rounding (tests/test_gguf_gemm.py)."""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import torch

from wslm.kernels import cpu_gemv

# `s` below is cpu_gguf.GGUFStruct, which routes its many-row products here: typed Any so this module never
# names cpu_gguf (no import circle, even a type-only one).

# From this many activation rows the tiled GEMM serves a block weight (fewer: cpu_gguf.mm, whose cost per
# row is flat and which reads the weight straight from the file's blocks; the GEMM unpacks its panels first).
# Measured with the interleaved tiles on a Zen 4 core (bench/gguf_gemm.py, 5120x3072, thread time): at 8 rows
# the GEMM is 0.4-0.7x the block kernel, at 16 rows 1.03-1.04x on Q4_0/Q4_K (0.74x on Q6_K), at 32 rows
# 1.1-1.4x on all three; at 512 rows 1.6-2.0x.
MIN_ROWS = 16
_lock = threading.Lock()
_bound: ctypes.CDLL | None = None


def library() -> ctypes.CDLL | None:
    """cpu_gemv's library with this file's entry points typed, or None where it is not built."""
    global _bound
    if _bound is not None:
        return _bound
    lib = cpu_gemv.library()
    if lib is None:
        return None
    with _lock:
        lib.wslm_gguf_gemm.restype = ctypes.c_int
        lib.wslm_gguf_gemm.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_int,
                                       ctypes.c_void_p, ctypes.c_int, ctypes.c_int]  # fmt: skip
        lib.wslm_gguf_gemm_takes.restype = ctypes.c_int
        lib.wslm_gguf_gemm_takes.argtypes = [ctypes.c_void_p]
        lib.wslm_gguf_gemm_native.restype = ctypes.c_int
        lib.wslm_gguf_gemm_struct_bytes.restype = ctypes.c_long
        _bound = lib
    return lib


def takes(s: Any) -> bool:
    """Whether the GEMM is built here and takes the weight behind s (cpu_gguf.struct_for)."""
    lib = library()
    return (
        lib is not None and lib.wslm_gguf_gemm_struct_bytes() == ctypes.sizeof(s)  # the same struct as cpu_gguf.c's
        and bool(lib.wslm_gguf_gemm_takes(ctypes.addressof(s)))
    )  # fmt: skip


def mm(x: torch.Tensor, s: Any, out_dtype: torch.dtype | None = None, threads: int | None = None
       ) -> torch.Tensor:  # fmt: skip
    """x [M, K] (bf16 or float32, contiguous) @ W.T -> [M, N] in out_dtype (bf16 or float32; None: x's)."""
    out = torch.empty(x.shape[0], s.n, dtype=out_dtype or x.dtype)
    rc = (_bound or library()).wslm_gguf_gemm(ctypes.addressof(s), x.data_ptr(), x.shape[0],
                                              int(x.dtype == torch.bfloat16), out.data_ptr(),
                                              int(out.dtype == torch.bfloat16),
                                              threads or torch.get_num_threads())  # fmt: skip
    if rc == -1:
        raise MemoryError("wslm_gguf_gemm: out of memory for the activations' int8 copy or a weight panel")
    if rc != 0:
        raise RuntimeError(f"wslm_gguf_gemm failed ({rc}): a block type or width it does not take")
    return out


def native() -> int:
    """256 where the tiles run AVX2 code here, 0 where they run the plain loop."""
    lib = library()
    return 0 if lib is None else int(lib.wslm_gguf_gemm_native())
