"""int8 and int4 weight-only products for decode rows on CPU: cpu_gemv.c, built with the system's C compiler.

torch's CPU kernels (aten._weight_int8pack_mm, _weight_int4pack_mm_for_cpu) wait on memory once a step's
other weights have pushed theirs out of cache, as every decode step does. The demo GGUF's int8 lm_head
(49152x576) took 1.9-3.5 ms a step on one core of a Xeon, up to a quarter of the step; cpu_gemv.c's loop,
which asks for rows a few ahead, 1.4-1.5 ms. Same math as torch's: fp32 sums, scales applied as they do,
rounded to bf16 once. Its int4 row reads torch's own pack in place; where the CPU has AVX512-VNNI and
-VBMI it rounds the activation row to int8 per 32 columns (llama.cpp's Q8 blocks) and multiplies 64
nibbles an instruction (vpdpbusd): one demo layer's four matrices in ~120 us out of cache against ~205 us
for the fp32 loop and ~215 us for torch's kernel (exact=True keeps torch's math).

The library is compiled on first use with -O3 -march=native (so AVX-512 / AVX2 are this CPU's own) into
the user cache, keyed by source, compiler flags and CPU; a machine without a C compiler, or a build that
fails, keeps torch's kernels (why_unavailable() says why; the engine logs it at start).
WSLM_CPU_KERNELS=0 turns them off."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from wslm import envs

logger = logging.getLogger(__name__)
ENV_VAR = "WSLM_CPU_KERNELS"
# One library from these: cpu_layer.c (a whole decode row, platforms/cpu/decode_native.py) calls cpu_gemv.c's products and
# cpu_gguf.c's (GGUF blocks in place, cpu_gguf.py); cpu_gguf_gemm.c: the same blocks times many rows.
SOURCES = tuple(Path(__file__).with_name(n) for n in ("cpu_gemv.c", "cpu_layer.c", "cpu_pause.c", "cpu_gguf.c",
                                                      "cpu_gguf_gemm.c"))
HEADERS = tuple(Path(__file__).with_name(n) for n in ("cpu_kernels.h", "cpu_gguf_blocks.h", "cpu_layer_body.h"))
# Above this many activation rows one bf16 GEMM over the expanded weight (AMX / AVX512-BF16) wins.
MAX_ROWS = 16
_FLAGS = ["-O3", "-march=native", "-fPIC", "-shared", "-fno-math-errno"]
# Extra compiler flags after ours (the last -march wins): e.g. -march=haswell builds the AVX2 loops a CPU
# without AVX-512 runs, to check or measure them on one that has it.
CFLAGS_VAR = "WSLM_CPU_KERNELS_CFLAGS"


def _flags() -> list[str]:
    return [*_FLAGS, *envs.get(CFLAGS_VAR).split()]

# What makes a compiler work here: gcc, libc's headers (build-essential); python3-dev for inductor's C++ too.
INSTALL_FIX = "sudo apt-get install -y build-essential python3-dev"

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False
_why: str | None = None  # why _lib is None, once tried


def compiler() -> str | None:
    """The C compiler to build with: $CC, else cc / gcc / clang on PATH."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return "".join(line for line in f if line.startswith(("model name", "flags")))[:4000]
    except OSError:
        return ""


def _cache_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("wslm", appauthor=False)) / "kernels"


def _build(cc: str) -> Path:
    source = b"".join(p.read_bytes() for p in (*SOURCES, *HEADERS))
    flags = _flags()
    key = hashlib.sha256(source + cc.encode() + " ".join(flags).encode() + _cpu_model().encode()).hexdigest()
    target = _cache_dir() / f"cpu_gemv-{key[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    last = ""
    for extra in (["-fopenmp"], []):  # OpenMP splits rows over torch's threads; a compiler without it: one
        with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".so", delete=False) as tmp:
            pass
        cmd = [cc, *flags, *extra, *map(str, SOURCES), "-o", tmp.name, "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode == 0:
            os.replace(tmp.name, target)  # atomic: a second process sees a whole library or none
            return target
        os.unlink(tmp.name)
        last = (done.stderr or done.stdout).strip()[-500:]
    raise RuntimeError(last or "the compiler failed")


def check_build(cc: str) -> str | None:
    """None when cc builds (or has built) a library that loads; else the compiler's or loader's error
    (`wslm doctor` asks this; the library lands in the cache, so the first server start need not build)."""
    try:
        ctypes.CDLL(str(_build(cc)))
    except Exception as exc:  # RuntimeError from the compiler, OSError from the loader, a timeout
        return _one_line(exc)
    return None


def _one_line(exc: Exception) -> str:
    """A compiler's stderr in one line: its first error (the rest of gcc's output is context for it)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    line = next((x for x in lines if "error" in x.lower()), lines[-1] if lines else type(exc).__name__)
    return line[:200]


def why_unavailable() -> str | None:
    """None when the C kernels are built and loaded here; else one line: why not, and the fix."""
    library()
    return _why


def library() -> ctypes.CDLL | None:
    """The built library, or None where it cannot be had (then callers use torch's kernels; why_unavailable()
    says why: logged here at debug only, since the engine logs that line once at start)."""
    global _lib, _tried, _why
    if _tried:
        return _lib
    with _lock:
        if _tried:
            return _lib
        _why = None
        try:
            if not envs.get(ENV_VAR):
                _why = f"{ENV_VAR}={envs.raw(ENV_VAR)} turns the C kernels off"
            elif (cc := compiler()) is None:
                _why = f"no C compiler to build the C kernels (fix: {INSTALL_FIX})"
            else:
                lib = ctypes.CDLL(str(_build(cc)))
                fn = lib.wslm_int8_mm_bf16
                fn.restype = ctypes.c_int
                fn.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p,
                               ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_int]  # fmt: skip
                lib.wslm_int8_mm_f32.restype = ctypes.c_int
                lib.wslm_int8_mm_f32.argtypes = fn.argtypes
                for fn in (lib.wslm_int4_mv_bf16, lib.wslm_int4_mv_q8):
                    fn.restype = ctypes.c_int
                    fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 4 + [ctypes.c_int]
                lib.wslm_int4_mm_q8.restype = ctypes.c_int
                lib.wslm_int4_mm_q8.argtypes = [ctypes.c_void_p, ctypes.c_long] + [ctypes.c_void_p] * 3 + [
                    ctypes.c_long] * 4 + [ctypes.c_int]  # fmt: skip
                lib.wslm_int4_q8_native.restype = ctypes.c_int
                _lib = lib
        except envs.EnvError as exc:  # a typo in the variable: say so where the engine logs why, and serve
            _why = f"{exc} (torch's kernels run meanwhile)"
        except Exception as exc:  # an optimisation: never a reason not to serve
            _why = f"building the C kernels failed ({_one_line(exc)}; fix: {INSTALL_FIX})"
        if _why:
            logger.debug("CPU decode kernels not in use: %s; torch's kernels run instead", _why)
        _tried = True
        return _lib


@functools.cache
def amx() -> bool:
    """Whether torch's and inductor's AMX kernels serve this CPU (it has AMX and torch is not held to AVX2):
    from a few rows they beat these kernels; elsewhere these beat torch's one-row-at-a-time ones."""
    from wslm.kernels.cpu_features import cpu_flags

    return any(f.startswith("amx") for f in cpu_flags()) and torch.backends.cpu.get_cpu_capability() != "AVX2"


def rows_limit() -> int:
    """Activation rows up to which int8_mm serves decode rows: MAX_ROWS with AMX (from there the expanded
    bf16 GEMM wins), else any count below the callers' GEMM threshold (torch's kernel, one row at a time,
    is ~1.7x slower from 16 rows on a Zen 4 core)."""
    return MAX_ROWS if amx() else 1 << 30


def int8_mm_takes(qweight: torch.Tensor, scales: torch.Tensor) -> bool:
    """Whether int8_mm is built here and takes this weight (bf16 scales, shapes it is built for)."""
    return (
        qweight.device.type == "cpu" and scales.dtype == torch.bfloat16 and qweight.shape[0] % 4 == 0
        and qweight.shape[1] % 16 == 0 and library() is not None
    )  # fmt: skip


def int8_mm_ok(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> bool:
    """Whether int8_mm takes these: a few contiguous bf16 rows on CPU and a weight it takes."""
    return (
        x.device.type == "cpu" and x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS and x.dtype == torch.bfloat16
        and x.is_contiguous() and int8_mm_takes(qweight, scales)
    )  # fmt: skip


def int8_mm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
            out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """x [M, K] bf16 @ (qweight [N, K] int8 * scales [N, 1]).T -> [M, N] bf16 (or float32, not rounded: an LM
    head's logits); check int8_mm_ok first."""
    m, k = x.shape
    n = qweight.shape[0]
    out = torch.empty(m, n, dtype=out_dtype)
    fn = _lib.wslm_int8_mm_f32 if out_dtype == torch.float32 else _lib.wslm_int8_mm_bf16
    rc = fn(x.data_ptr(), m, qweight.data_ptr(), scales.data_ptr(), out.data_ptr(), n, k, torch.get_num_threads())
    if rc != 0:
        raise MemoryError("wslm_int8_mm_bf16: out of memory for the activations' float copy")
    return out


def int4_mv_takes(packed: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int, block_n: int = 64) -> bool:
    """Whether int4_mv is built here and takes this weight: torch's CPU int4 pack of a weight with a
    multiple of block_n rows (the pack's rows per block: 64, or 32 where torch runs AVX2 code), bf16 scales
    and zeros."""
    groups, n = scales_and_zeros.shape[:2]
    return (
        packed.device.type == "cpu" and scales_and_zeros.dtype == torch.bfloat16 and block_n in (64, 32)
        and scales_and_zeros.is_contiguous() and n % block_n == 0 and packed.dtype == torch.uint8
        and group_size % 32 == 0 and packed.numel() * 2 == n * groups * group_size and library() is not None
    )  # fmt: skip


def int4_mv_ok(
    x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int, block_n: int = 64
) -> bool:
    """Whether int4_mv takes these: one contiguous bf16 row on CPU and a weight it takes."""
    return (
        x.device.type == "cpu" and x.dim() == 2 and x.shape[0] == 1 and x.dtype == torch.bfloat16
        and x.is_contiguous() and x.shape[1] == scales_and_zeros.shape[0] * group_size
        and int4_mv_takes(packed, scales_and_zeros, group_size, block_n)
    )  # fmt: skip


def int4_q8() -> bool:
    """Whether int4_mv rounds the row to int8 here (the CPU has AVX2, or AVX512-VBMI and -VNNI): then its
    outputs differ from torch's kernel by about a bf16 rounding; else it computes torch's math exactly."""
    return library() is not None and bool(_lib.wslm_int4_q8_native())


def int4_mv(
    x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int, exact: bool = False,
    block_n: int = 64,
) -> torch.Tensor:
    """x [1, K] bf16 @ W.T for torch's CPU int4 pack of W [N, K] -> [1, N] bf16; check int4_mv_ok first.
    Where int4_q8(): the row rounded to int8 per 32 columns (as llama.cpp does), ~1.7x faster out of
    cache (AVX-512; ~5x the plain loop's speed with AVX2); exact=True (or a CPU without those
    instructions): aten._weight_int4pack_mm_for_cpu's math."""
    n = scales_and_zeros.shape[1]
    out = torch.empty(1, n, dtype=torch.bfloat16)
    fn = _lib.wslm_int4_mv_bf16 if exact else _lib.wslm_int4_mv_q8
    rc = fn(x.data_ptr(), packed.data_ptr(), scales_and_zeros.data_ptr(), out.data_ptr(), n, x.shape[1], group_size,
            block_n, torch.get_num_threads())  # fmt: skip
    if rc != 0:
        raise MemoryError("int4_mv: out of memory for the activation's copy")
    return out


def int4_mm(
    x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int, block_n: int = 64
) -> torch.Tensor:
    """x [M, K] bf16 (contiguous) @ W.T -> [M, N] bf16 for a weight int4_mv_takes: every row as int4_mv
    computes it (the same bits), each block of weight rows read once for all M rows."""
    m, n = x.shape[0], scales_and_zeros.shape[1]
    out = torch.empty(m, n, dtype=torch.bfloat16)
    rc = _lib.wslm_int4_mm_q8(x.data_ptr(), m, packed.data_ptr(), scales_and_zeros.data_ptr(), out.data_ptr(), n,
                              x.shape[1], group_size, block_n, torch.get_num_threads())  # fmt: skip
    if rc != 0:
        raise MemoryError("int4_mm: out of memory for the activations' copy")
    return out


@torch.library.custom_op("wslm::int4_mm_q8", mutates_args=())
def int4_mm_op(x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int,
               block_n: int) -> torch.Tensor:  # fmt: skip
    """int4_mm as an op a compiled graph can call (platforms/cpu/decode_compiled.py, where inductor has no int4 template of
    its own for this CPU)."""
    return int4_mm(x.contiguous(), packed, scales_and_zeros, group_size, block_n)


@int4_mm_op.register_fake
def _(x, packed, scales_and_zeros, group_size, block_n):
    return x.new_empty((x.shape[0], scales_and_zeros.shape[1]), dtype=torch.bfloat16)
