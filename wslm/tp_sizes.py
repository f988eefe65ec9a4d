"""Which --tensor-parallel-size values fit: pure arithmetic, no torch, so `wslm doctor` and the GUI (whose
Windows bundle carries no backend) can ask."""

from __future__ import annotations


def fits(size: int, num_heads: int | None = None, num_kv_heads: int | None = None,
         intermediate_size: int | None = None) -> bool:  # fmt: skip
    """The same rule the engine enforces at start (parallel_state.check_divisible)."""
    if size < 1:
        return False
    if num_heads is not None and num_heads % size:
        return False
    if num_kv_heads is not None and (num_kv_heads % size if num_kv_heads >= size else size % num_kv_heads):
        return False
    return intermediate_size is None or intermediate_size % size == 0


def tensor_parallel_sizes(gpu_count: int, num_heads: int | None = None, num_kv_heads: int | None = None,
                          intermediate_size: int | None = None) -> list[int]:  # fmt: skip
    """Sizes from 1 to the GPU count that split the model evenly (all of them when the model is unknown)."""
    return [n for n in range(1, max(1, gpu_count) + 1) if fits(n, num_heads, num_kv_heads, intermediate_size)]
