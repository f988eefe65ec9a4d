"""How many KV blocks the pool gets: kv_sizing.plan_kv_pool (what `wslm models info` reports too), capped on
CUDA by what gpu_memory_utilization leaves, on CPU by a share of the RAM."""

from __future__ import annotations

import logging

import torch

from wslm import envs
from wslm.backend.config import EngineConfig
from wslm.backend.modeling.config import ModelConfig

# parse_bytes lives in the torch-free kv_sizing (`wslm models list --kv-cache-memory` parses sizes as serve does).
from wslm.backend.platforms.cpu.kv_sizing import (  # noqa: F401  (parse_bytes: re-exported)
    KvPoolPlan,
    available_ram,
    kv_context,
    parse_bytes,
    plan_kv_pool,
)

logger = logging.getLogger(__name__)


def _cuda_budget(config: EngineConfig, mc: ModelConfig, device: torch.device) -> int:
    free, total = torch.cuda.mem_get_info(device)
    used = total - free  # weights (already loaded) and whatever else runs on the card
    # Room for activations of the largest step and the logits of a full decode batch.
    activations = config.max_num_batched_tokens * (mc.hidden_size * 12 + mc.intermediate_size * 4) * 4
    logits = config.max_num_seqs * mc.vocab_size * 4 * 3
    budget = int(total * config.gpu_memory_utilization) - used - activations - logits
    if budget <= 0:
        raise ValueError(
            f"No GPU memory left for the KV cache: the card has {total / 2**30:.1f} GiB, {used / 2**30:.1f} GiB "
            f"are in use after loading the model, and gpu_memory_utilization={config.gpu_memory_utilization}. "
            "Raise --gpu-memory-utilization, lower --max-num-batched-tokens, or pick a smaller model."
        )
    return budget


def kv_cache_torch_dtype(name: str, device: torch.device) -> torch.dtype | None:
    """--kv-cache-dtype as a torch dtype; None keeps the model dtype. fp8 is e4m3 (vLLM's "fp8"): on CUDA
    the Triton kernels convert it in registers, which needs an Ada/Hopper GPU (compute capability 8.9)."""
    if name in ("auto", None):
        return None
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        major, minor = torch.cuda.get_device_capability(device)
        raise ValueError(
            f"--kv-cache-dtype {name} needs an NVIDIA GPU of compute capability 8.9 or newer (Ada, Hopper); this one "
            f"is {major}.{minor}. Leave --kv-cache-dtype at auto, or give the pool more room with "
            "--gpu-memory-utilization / a shorter --max-model-len."
        )
    return torch.float8_e4m3fn


def plan_pool(config: EngineConfig, mc: ModelConfig, device: torch.device, extra_kv_bytes_per_token: int = 0
              ) -> KvPoolPlan:
    """The pool for this engine: by need (max_num_seqs full-length sequences), within the memory cap, unless
    --num-gpu-blocks-override, --kv-cache-memory (CPU) or WSLM_CPU_KVCACHE_SPACE (CPU) say otherwise.
    extra_kv_bytes_per_token: a draft model's keys and values, held in blocks of the same ids."""
    # Sized for the context asked for (else the model's own), as `wslm models info` estimates it; when every
    # layer is windowed a sequence holds only its window's blocks (block_manager.py).
    seq_tokens = kv_context(config.max_model_len or mc.max_position_embeddings, mc.uniform_sliding_window,
                            config.max_num_batched_tokens)
    explicit = {"num_blocks_override": config.num_gpu_blocks_override}
    cap = None
    if device.type == "cuda":
        explicit["cap_flag"] = "--gpu-memory-utilization"
        if config.num_gpu_blocks_override is None:
            cap = _cuda_budget(config, mc, device)
    else:
        explicit.update(kv_cache_memory=config.kv_cache_memory, cpu_kvcache_space_gib=envs.WSLM_CPU_KVCACHE_SPACE)
    return plan_kv_pool(mc.kv_bytes_per_token() + int(extra_kv_bytes_per_token), seq_tokens, config.max_num_seqs,
                        config.block_size, cap_bytes=cap, **explicit)


def determine_num_blocks(config: EngineConfig, mc: ModelConfig, device: torch.device,
                         extra_kv_bytes_per_token: int = 0) -> int:
    plan = plan_pool(config, mc, device, extra_kv_bytes_per_token)
    if plan.num_blocks < 2:
        raise ValueError(
            f"The KV cache budget ({plan.bytes / 2**20:.0f} MiB) holds fewer than 2 blocks of {config.block_size} "
            "tokens for this model. Give it more room: --kv-cache-memory on CPU, --gpu-memory-utilization on GPU."
        )
    logger.info("%s", plan.describe())
    if extra_kv_bytes_per_token:
        logger.info("The pool's size counts the speculative draft model's keys and values too (%d of every %d "
                    "bytes a token): each of its blocks is held by both models.", extra_kv_bytes_per_token,
                    plan.bytes_per_block // plan.block_size)
    free = available_ram() if device.type == "cpu" else None
    if free is not None and plan.bytes > free:
        logger.warning("The KV cache pool (%.2f GiB) is more than the RAM free now (%.2f GiB): the system may swap "
                       "or end the server. Lower --kv-cache-memory / --max-num-seqs / --max-model-len.",
                       plan.bytes / 2**30, free / 2**30)
    return int(plan.num_blocks)


def allocate_pool(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The pool's zeroed memory. On CPU: anonymous pages, which the kernel maps as zeros and makes resident
    only when a block is first written, so a start does not spend ~0.25 s a GiB zeroing a pool most chats
    never fill, and resident memory grows with the KV in use (the pool is still sized at start, from the
    machine's total RAM; kv_sizing.py). Elsewhere: torch.zeros."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    import math
    import mmap

    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(pages, dtype=dtype).view(shape)  # the tensor keeps the mapping alive
