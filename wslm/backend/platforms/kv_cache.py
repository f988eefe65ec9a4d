"""How many KV blocks the pool gets: from gpu_memory_utilization on CUDA, kv_cache_memory on CPU."""

from __future__ import annotations

import logging

import torch

from wslm import envs
from wslm.backend.config import EngineConfig
from wslm.backend.modeling.config import ModelConfig

# parse_bytes lives in the torch-free kv_sizing (`wslm models list --kv-cache-memory` parses sizes as serve does).
from wslm.backend.platforms.cpu.kv_sizing import (  # noqa: F401  (parse_bytes: re-exported)
    available_ram,
    default_cpu_kv_cache_bytes,
    kv_context,
    parse_bytes,
)

logger = logging.getLogger(__name__)


def _cpu_budget(config: EngineConfig, mc: ModelConfig) -> int:
    if config.kv_cache_memory is not None:
        return int(config.kv_cache_memory)
    gib = envs.WSLM_CPU_KVCACHE_SPACE  # like vLLM's VLLM_CPU_KVCACHE_SPACE
    if gib is not None:
        return int(gib * (1 << 30))
    # Sized for the context asked for (else the model's own), as `wslm models info` estimates it; when every
    # layer is windowed a sequence holds only its window's blocks (block_manager.py).
    context = kv_context(config.max_model_len or mc.max_position_embeddings, mc.uniform_sliding_window,
                         config.max_num_batched_tokens)
    return default_cpu_kv_cache_bytes(mc.kv_bytes_per_token(), context, available_ram())


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


def determine_num_blocks(config: EngineConfig, mc: ModelConfig, device: torch.device) -> int:
    if config.num_gpu_blocks_override is not None:
        return int(config.num_gpu_blocks_override)
    budget = _cuda_budget(config, mc, device) if device.type == "cuda" else _cpu_budget(config, mc)
    per_block = mc.kv_bytes_per_token() * config.block_size
    num_blocks = budget // per_block
    if num_blocks < 2:
        raise ValueError(
            f"The KV cache budget ({budget / 2**20:.0f} MiB) holds fewer than 2 blocks of {config.block_size} "
            "tokens for this model. Give it more room: --kv-cache-memory on CPU, --gpu-memory-utilization on GPU."
        )
    return int(num_blocks)
