"""The default size of the KV-cache pool on CPU, in one place: the engine reserves it (kv_cache.py) and
`wslm models list/info` adds it to a model's memory estimate, so the two always agree. Pure (no torch).

The pool scales with the model and the context: room for DEFAULT_KV_SEQUENCES full-length sequences,
never more than CPU_KV_CAP nor RAM_SHARE of the free RAM, never less than CPU_KV_MIN."""

from __future__ import annotations

DEFAULT_KV_SEQUENCES = 4  # concurrent full-context requests the default pool holds
CPU_KV_CAP = 2 << 30  # a CPU box rarely benefits from more: batches are compute-bound long before
CPU_KV_MIN = 64 << 20
RAM_SHARE = 0.2
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(value: str | int) -> int:
    """'4GiB', '512M', '1.5g' or a plain byte count -> bytes."""
    import re

    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmgt]?)(i?b)?\s*", str(value).lower())
    if not m:
        raise ValueError(f"Cannot read {value!r} as a size: use bytes or a unit, e.g. 4GiB or 512MiB.")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def available_ram() -> int | None:
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


def kv_context(context: int, uniform_window: int | None, max_step_tokens: int) -> int:
    """The tokens one sequence keeps in the pool: its context, or, when every layer is windowed (the block
    manager frees blocks behind the window), the window plus one step's new tokens."""
    return min(context, uniform_window + max_step_tokens) if uniform_window else context


def default_cpu_kv_cache_bytes(kv_bytes_per_token: int, context: int, free_ram: int | None = None) -> int:
    """Bytes of KV cache reserved when neither --kv-cache-memory nor WSLM_CPU_KVCACHE_SPACE says."""
    want = int(kv_bytes_per_token) * int(context) * DEFAULT_KV_SEQUENCES
    cap = CPU_KV_CAP if free_ram is None else min(CPU_KV_CAP, int(free_ram * RAM_SHARE))
    return max(CPU_KV_MIN, min(want, cap))


def runtime_value_bytes() -> int:
    """Bytes per weight and KV value the engine computes in with dtype=auto here: 16-bit on a GPU and on CPUs
    that multiply bf16 natively, 32-bit on other CPUs (cpu_tuning.cpu_auto_dtype, the engine's own rule)."""
    import os

    from wslm.backend.platforms.cpu.tuning import cpu_auto_dtype

    if os.path.exists("/dev/nvidia0") or os.path.exists("/dev/dxg"):
        return 2
    return 2 if cpu_auto_dtype()[0] == "bfloat16" else 4
