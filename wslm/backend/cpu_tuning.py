"""glibc malloc settings for a CPU engine.

A decode step allocates a few MB-sized tensors (the gathered KV blocks, the logits). With glibc's
defaults, blocks that size are mmapped or trimmed back to the kernel on free, so every step pays page
faults to get them back: decode attention at batch 32 ran 4x slower for it (bench notes in
docs/benchmarks.md). Keeping them in the heap removes that; the cost is that up to TRIM_THRESHOLD of
freed memory stays with the process."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

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
