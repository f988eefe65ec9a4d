"""Building an EngineCore: the executor (weights, KV pool), the context length the pool allows, the core,
the warm-up. The same in the server's process (in-process client) and in a core process
(engine/core_proc.py); what the front end needs back is CoreInfo (plain data)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from wslm.backend.engine.block_manager import window_blocks
from wslm.backend.engine.core import EngineCore
from wslm.backend.executor import make_executor

logger = logging.getLogger("wslm.engine")

# Set once this process has run a model itself (an in-process core, an encoder): OpenMP's worker threads do
# not survive a fork, and a forked child that then enters a parallel region waits for them forever; so later
# core processes start by spawn (core_client.safe_start_method).
_model_ran_here = False


def note_model_in_process() -> None:
    global _model_ran_here
    _model_ran_here = True


def model_ran_here() -> bool:
    return _model_ran_here


@dataclass(slots=True)
class CoreInfo:
    """What the front end learns from a built core (crosses the process boundary)."""

    num_blocks: int
    kv_cache_bytes: int
    max_model_len: int
    window_blocks: int | None  # blocks one sequence holds at most when every layer is windowed, else None


def build_core(config, source, mc, device, embedding: bool = False, in_core_process: bool = False,
               model_max: int | None = None) -> tuple[EngineCore, CoreInfo]:
    """The ready core; sets mc.max_model_len (at most model_max: the model's context unless given).
    ValueError (a user's mistake, e.g. --max-model-len over what the KV pool holds) names the flag to change."""
    if not in_core_process:
        note_model_in_process()
    executor = make_executor(config, source, mc, device, embedding=embedding)
    try:
        num_blocks = executor.num_blocks
        # Every layer windowed: the block manager frees blocks behind the window, so one sequence holds at most
        # `held` blocks and, when the pool has that many, the context is the model's own, not what the pool holds.
        window = mc.uniform_sliding_window
        held = window_blocks(window, config.block_size, config.max_num_batched_tokens) if window else None
        capacity = num_blocks * config.block_size
        if held is not None and num_blocks >= held:
            capacity = max(capacity, mc.max_position_embeddings)
        try:
            mc.max_model_len = resolve_max_model_len(config.max_model_len, model_max or mc.max_position_embeddings,
                                                     capacity)
        except ValueError as exc:
            spec = config.speculative()
            if spec is None or spec.method != "draft_model":
                raise
            raise ValueError(f"{exc} The speculative draft model's keys and values share that memory (each block "
                             "holds both models'); without --speculative-config the same memory holds more.") from None
        core = EngineCore(config, mc, executor)
        executor.warm_up(config.max_num_seqs, mc.max_model_len, config.enforce_eager)
    except BaseException:
        executor.shutdown()
        raise
    return core, CoreInfo(num_blocks, executor.kv_cache_bytes, mc.max_model_len, held)


def resolve_max_model_len(asked: int | None, model_max: int, capacity: int) -> int:
    if asked is None:
        if capacity < model_max:
            logger.info("max_model_len capped at %d tokens: all the KV cache holds", capacity)
        return min(model_max, capacity)
    if asked > model_max:
        raise ValueError(
            f"max_model_len={asked} is longer than the model's context ({model_max} tokens). "
            f"Use --max-model-len {model_max} or less."
        )
    if asked > capacity:
        raise ValueError(
            f"max_model_len={asked} does not fit in the KV cache, which holds {capacity} tokens. Lower "
            "--max-model-len, or give the cache more memory (--kv-cache-memory on CPU, "
            "--gpu-memory-utilization on GPU)."
        )
    return asked
