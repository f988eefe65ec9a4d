"""PyTorch reshape_and_cache: scatter new keys/values into their cache slots (reference and CPU path)."""

from __future__ import annotations

import torch

from wslm.kernels.step_memo import step_memo

_BYTE_TYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """See wslm.kernels.reshape_and_cache."""
    num_blocks, block_size = k_cache.shape[0], k_cache.shape[1]
    slots = (
        slot_mapping
        if slot_mapping.dim() == 1 and slot_mapping.dtype == torch.int64
        else slot_mapping.reshape(-1).long()
    )
    # Whether any token is padding: the same for every layer of a step (step_memo.py).
    if not step_memo(("slots_valid",), (slot_mapping,), lambda: bool((slots >= 0).all())):
        keep = slots >= 0
        slots, key, value = slots[keep], key[keep], value[keep]
    if slots.numel() == 0:
        return
    for src, cache in ((key, k_cache), (value, v_cache)):
        if src.dtype != cache.dtype:  # (each no-op op still costs microseconds on CPU)
            src = src.to(cache.dtype)  # to fp8 (--kv-cache-dtype fp8): torch saturates at +-448
        if cache.dtype in _BYTE_TYPES:  # CPU index_copy_ has no fp8 kernel: copy the bytes
            cache, src = cache.view(torch.uint8), src.view(torch.uint8)
        if cache.is_contiguous():
            # [blocks * block_size, Hkv, D] is a view of the cache: one index_copy_ writes in place.
            cache.view(num_blocks * block_size, *cache.shape[2:]).index_copy_(0, slots, src)
        else:
            cache[slots // block_size, slots % block_size] = src
