"""The KV-cache pool's size, in one place: the engine reserves it (platforms/kv_cache.py, which logs it at
start) and `wslm models list/info` (and through them the GUI's estimate) report it, all from plan_kv_pool, so
the three say the same number. Pure (no torch).

By default the pool holds what the batch can use: --max-num-seqs sequences of --max-model-len tokens each
(whole blocks), capped by a share of memory: on CPU the smaller of CPU_KV_CAP and KV_RAM_FRACTION of the
machine's RAM (the total, not what is free at the moment, so that an estimate made before the start and the
server agree); on CUDA what --gpu-memory-utilization leaves after the weights. When the batch's need does not
fit, the pool is the cap and the plan says how many full-length sequences fit (vLLM's "Maximum concurrency").
--num-gpu-blocks-override, --kv-cache-memory and WSLM_CPU_KVCACHE_SPACE, in that order, win over all of it."""

from __future__ import annotations

from dataclasses import dataclass

from wslm import defaults

CPU_KV_CAP = 2 << 30  # a CPU box rarely benefits from more: batches are compute-bound long before
CPU_KV_MIN = 64 << 20  # the cap never goes below this (a machine with little RAM still serves a chat)
KV_RAM_FRACTION = 0.2  # of the machine's RAM, the most the default pool takes on CPU
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


def total_ram() -> int | None:
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().total)


def cpu_kv_cap_bytes(ram: int | None = None) -> int:
    """The most the default pool takes on CPU: the smaller of CPU_KV_CAP and KV_RAM_FRACTION of the RAM."""
    ram = total_ram() if ram is None else ram
    cap = CPU_KV_CAP if ram is None else min(CPU_KV_CAP, int(ram * KV_RAM_FRACTION))
    return max(CPU_KV_MIN, cap)


@dataclass(frozen=True, slots=True)
class KvPoolPlan:
    """How big the KV pool is and why."""

    num_blocks: int
    block_size: int
    bytes_per_block: int
    seq_tokens: int  # the KV tokens one full-length sequence holds (its context, or its window)
    max_num_seqs: int
    need_blocks: int  # what max_num_seqs full-length sequences can use
    cap_bytes: int | None  # the memory cap the default is held to (None: an explicit size)
    source: str  # "need", "cap", "kv_cache_memory", "WSLM_CPU_KVCACHE_SPACE" or "num_gpu_blocks_override"
    cap_flag: str = "--kv-cache-memory"  # the flag that sets the pool's memory on this device

    @property
    def bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    @property
    def tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def need_bytes(self) -> int:
        return self.need_blocks * self.bytes_per_block

    @property
    def max_concurrency(self) -> float:
        """Full-length sequences the pool holds at once (vLLM's "Maximum concurrency")."""
        return self.tokens / max(1, self.seq_tokens)

    def describe(self) -> str:
        """The start log's line (and `wslm models info`'s): the size, exactly, and why."""
        gib = 2**30
        head = (f"KV cache pool: {self.bytes / gib:.2f} GiB ({self.bytes} bytes) = {self.num_blocks} blocks of "
                f"{self.block_size} tokens = {self.tokens} tokens")
        want = f"{self.max_num_seqs} sequences x {self.seq_tokens} tokens need {self.need_bytes / gib:.2f} GiB"
        if self.source == "need":
            why = f"sized by need: {want}"
        elif self.source == "cap":
            why = (f"capped at {self.cap_bytes / gib:.2f} GiB of memory ({want}: more with {self.cap_flag}, or "
                   "lower --max-num-seqs / --max-model-len)")
        else:
            why = f"set by {self.source}"
        return (f"{head}; {why}. Maximum concurrency for {self.seq_tokens} tokens per request: "
                f"{self.max_concurrency:.2f}x")


def plan_kv_pool(
    kv_bytes_per_token: int,
    seq_tokens: int,
    max_num_seqs: int = defaults.MAX_NUM_SEQS,
    block_size: int = defaults.BLOCK_SIZE,
    *,
    kv_cache_memory: int | None = None,
    cpu_kvcache_space_gib: float | None = None,
    num_blocks_override: int | None = None,
    cap_bytes: int | None = None,
    cap_flag: str = "--kv-cache-memory",
) -> KvPoolPlan:
    """The pool for sequences of `seq_tokens` KV tokens (kv_context) at `kv_bytes_per_token`. cap_bytes: the
    default's memory cap (None: the CPU's, cpu_kv_cap_bytes()); the explicit settings win over the default."""
    per_block = max(1, int(kv_bytes_per_token) * int(block_size))
    seq_tokens = max(1, int(seq_tokens))
    need = int(max_num_seqs) * -(-seq_tokens // block_size)
    plan = dict(block_size=int(block_size), bytes_per_block=per_block, seq_tokens=seq_tokens,
                max_num_seqs=int(max_num_seqs), need_blocks=need, cap_flag=cap_flag)
    if num_blocks_override is not None:
        return KvPoolPlan(int(num_blocks_override), cap_bytes=None, source="num_gpu_blocks_override", **plan)
    if kv_cache_memory is not None:
        return KvPoolPlan(int(kv_cache_memory) // per_block, cap_bytes=None, source="kv_cache_memory", **plan)
    if cpu_kvcache_space_gib is not None:
        return KvPoolPlan(int(cpu_kvcache_space_gib * (1 << 30)) // per_block, cap_bytes=None,
                          source="WSLM_CPU_KVCACHE_SPACE", **plan)
    cap = cpu_kv_cap_bytes() if cap_bytes is None else int(cap_bytes)
    if need * per_block <= cap:
        return KvPoolPlan(need, cap_bytes=cap, source="need", **plan)
    return KvPoolPlan(cap // per_block, cap_bytes=cap, source="cap", **plan)


def runtime_value_bytes() -> int:
    """Bytes per weight and KV value the engine computes in with dtype=auto here: 16-bit on a GPU and on CPUs
    that multiply bf16 natively, 32-bit on other CPUs (cpu_tuning.cpu_auto_dtype, the engine's own rule)."""
    import os

    from wslm.backend.platforms.cpu.tuning import cpu_auto_dtype

    if os.path.exists("/dev/nvidia0") or os.path.exists("/dev/dxg"):
        return 2
    return 2 if cpu_auto_dtype()[0] == "bfloat16" else 4
