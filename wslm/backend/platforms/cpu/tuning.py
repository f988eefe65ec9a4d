"""glibc malloc settings for a CPU engine.

A decode step allocates a few MB-sized tensors (the gathered KV blocks, the logits). With glibc's
defaults, blocks that size are mmapped or trimmed back to the kernel on free, so every step pays page
faults to get them back: decode attention at batch 32 ran 4x slower for it (bench notes in
docs/benchmarks.md). Keeping them in the heap removes that; the cost is that up to TRIM_THRESHOLD of
freed memory stays with the process."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import sys

from wslm import envs
from wslm.kernels.cpu_features import cpu_flags

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's own ceiling for this setting on 64-bit
TRIM_THRESHOLD = 256 << 20
_done = False


def tune_allocator() -> bool:
    """Apply once per process; True when glibc took the settings."""
    global _done
    if _done or not sys.platform.startswith("linux"):
        return _done
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other libcs have no mallopt
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    _done = ok
    logger.debug("malloc tuned for the CPU engine: %s", ok)
    return ok


# ---- the CPU compute dtype -------------------------------------------------------------------------
# bfloat16 halves the bytes every decode step reads, but only pays where the CPU multiplies bf16 natively
# (AVX512-BF16 on Zen 4 / Cooper Lake and later, AMX on Sapphire Rapids): there bf16 GEMMs run ~2x faster
# than fp32 (bench/throughput.py). Elsewhere (AVX2: Zen 2/3, most laptops) oneDNN converts in software and
# a batch-32 bf16 GEMM runs ~10x slower than fp32, so fp32 stays the default there.
_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_auto_dtype() -> tuple[str, str]:
    """("bfloat16" | "float32", why) for dtype=auto on this CPU."""
    flags = cpu_flags()
    native = [f for f in _BF16_FLAGS if f in flags]
    if native:
        return "bfloat16", f"the CPU multiplies bf16 natively ({', '.join(native)})"
    if not flags:
        return "float32", "the CPU's flags could not be read (/proc/cpuinfo)"
    return "float32", "the CPU has neither avx512_bf16 nor amx_bf16 (bf16 matmuls would be emulated, slower)"


# Decode steps of up to this many sequences run on one intra-op thread on CPU when OpenMP threads sleep
# between parallel regions (OMP_WAIT_POLICY=PASSIVE, wslm's default): waking the other threads for each of
# a small step's hundreds of ops costs more than they add. Demo GGUF, 2 cores, idle: one chat 38 -> 71
# tok/s eager, 40 -> 80 compiled; at 32 chats two threads stay faster (292 vs 247).
# (Compiled graphs guard on the thread count: one size class, one count, or every step would recompile.)
SMALL_STEP_ROWS: int = envs.WSLM_SMALL_STEP_ROWS  # a constant: read each step


@contextlib.contextmanager
def one_thread_when(small: bool):
    import torch  # lazily: `wslm models` reads this module's neighbours without torch

    threads = torch.get_num_threads()
    if not small or threads == 1 or os.environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE":
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def torch_threads(n: int):
    """torch's intra-op thread count set to n for the block."""
    import torch

    before = torch.get_num_threads()
    if n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class StepThreads:
    """How many threads a lone sequence's C decode step runs on: one, or all of torch's, whichever its
    recent steps measured faster on this machine as it is now.

    Neither is right everywhere: on an idle machine the team of all threads is faster (more cores read the
    weights), but when something else keeps the cores busy (another process, the server's own threads on
    a 2-core VM) a team waits at every barrier for a thread that is not running, and one thread is several
    times faster (docs/benchmarks.md). So the steps run on the count measured faster, and every so often
    a few steps try the other; a try that loses waits twice as long before the next one (up to
    MAX_INTERVAL steps), so a machine that stays busy pays for few of them. A count whose steps become
    slower than the other's last try tries the other at once."""

    TRIES = 3  # steps a try runs; the first warms the caches and is not counted
    FIRST_INTERVAL = 16
    MAX_INTERVAL = 1024
    MARGIN = 0.95  # the other count must be this much faster to take over

    def __init__(self) -> None:
        self.current: int | None = None
        self.took: dict[int, float] = {}  # threads -> seconds a step, smoothed
        self.interval = self.FIRST_INTERVAL
        self.since = 0  # steps on current since the last try
        self.trying = 0  # steps left in the running try
        self._tried: list[float] = []

    def pick(self, most: int) -> int:
        if most <= 1:
            return 1
        if self.current not in (1, most):
            self.current, self.took, self.trying = most, {}, 0
        if self.trying:
            return self._other(most)
        other = self._other(most)
        mine, theirs = self.took.get(self.current), self.took.get(other)
        # Time for a try; or at once when this count has become slower than the other was (the machine
        # just got busy): waiting out the interval would run hundreds of slow steps.
        if self.since >= self.interval or theirs is None or (mine is not None and mine * self.MARGIN > theirs):
            self.trying, self.since, self._tried = self.TRIES, 0, []
            return other
        return self.current

    def record(self, threads: int, seconds: float) -> None:
        if threads == self.current and not self.trying:
            before = self.took.get(threads)
            self.took[threads] = seconds if before is None else 0.75 * before + 0.25 * seconds
            self.since += 1
            return
        if not self.trying:
            return
        self._tried.append(seconds)
        self.trying -= 1
        if self.trying:
            return
        other = sum(self._tried[1:]) / max(1, len(self._tried) - 1)
        self.took[threads] = other
        mine = self.took.get(self.current)
        if mine is not None and other < mine * self.MARGIN:
            self.current, self.interval = threads, self.FIRST_INTERVAL
        elif mine is not None:
            self.interval = min(self.interval * 2, self.MAX_INTERVAL)

    def _other(self, most: int) -> int:
        return 1 if self.current == most else most
