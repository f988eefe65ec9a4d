"""EngineConfig: every knob of the engine, named after vLLM's engine arguments."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from wslm import defaults
from wslm.backend.quant.registry import method_names

# vLLM's --kv-cache-dtype values that wslm runs.
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048  # also what `wslm models info` assumes when it sizes a windowed pool


def _flag(default: Any, help: str, **more: Any) -> Any:
    """A field that is also a `wslm serve` flag: help, and optionally choices and aliases, for argparse."""
    return field(default=default, metadata={"help": help, **more})


@dataclass(slots=True)
class EngineConfig:
    # Each field is also a `wslm serve` flag (--field-name, generated in entrypoints/cli/engine_flags.py):
    # its metadata holds the flag's help and, where vLLM has them, choices and short aliases.
    model: str = _flag(defaults.MODEL, '"demo" (default), a HF folder, a .gguf file or a model id')
    tokenizer: str | None = _flag(None, "a tokenizer folder or repo id other than the model's")
    mmproj: str | None = _flag(None, "a GGUF model's vision projector (llama.cpp's mmproj GGUF): images in chat; "
                               "by default an mmproj*.gguf beside the model file is used; none: text only")
    # None: the model's own, capped by what the KV pool holds
    max_model_len: int | None = _flag(None, "context length in tokens (e.g. 4096 or 4k)")
    max_num_seqs: int = _flag(defaults.MAX_NUM_SEQS, "most sequences in one batch (the default KV pool holds this many "
                                                             "full-length sequences, within its memory cap)")
    # the per-step token budget (chunked prefill)
    max_num_batched_tokens: int = _flag(DEFAULT_MAX_NUM_BATCHED_TOKENS, "token budget per step")
    # Fairness (scheduler.py): while streams decode, prefill gets at most this many tokens per step
    # (None: max_num_batched_tokens // 8), and one request adds at most fanout_per_step sequences per step.
    long_prefill_token_threshold: int | None = _flag(
        None, "while streams decode, prefill tokens per step at most this (fairness; default: "
        "max-num-batched-tokens / 8)")
    fanout_per_step: int = _flag(16, "new sequences one request (n > 1) may start per step (fairness; default 16)")
    block_size: int = _flag(defaults.BLOCK_SIZE, "KV-cache block size in tokens")
    enable_prefix_caching: bool = _flag(True, "reuse the KV cache of shared prompt prefixes (default: on)")
    device: str = _flag("auto", "auto, cpu, cuda or cuda:N")
    # auto: bf16 on GPUs (fp16 for fp16 models) and on bf16-native CPUs, else fp32
    dtype: str = _flag("auto", "auto, float32, float16 or bfloat16")
    gpu_memory_utilization: float = _flag(defaults.GPU_MEMORY_UTILIZATION, "CUDA: share of the GPU to use")
    # CPU: bytes for the KV pool (None: from free RAM)
    kv_cache_memory: int | None = _flag(None, "KV-cache size: bytes, or like 4GiB / 512MiB",
                                        aliases=("--kv-cache-memory-bytes",))  # vLLM's name
    num_gpu_blocks_override: int | None = _flag(
        None, "exact KV-cache size in blocks, instead of sizing it from memory (tests, tuning)")
    chat_template: str | None = _flag(None, "a Jinja chat template, or a path to one")
    seed: int = _flag(0, "random seed")
    tensor_parallel_size: int = _flag(
        1, "split the model over N GPUs (or N CPU processes) with torch.distributed", aliases=("-tp",))
    distributed_executor_backend: str | None = _flag(
        None, "uni: one device in this process (default at one rank); mp: one process per rank on this machine "
        "(default above one); ray: ranks on a Ray cluster; package.module:Class: an executor of your own")
    enforce_eager: bool = _flag(False, "run eagerly: no CUDA graphs, no compiled CPU decode step")
    trust_remote_code: bool = _flag(
        False, "let transformers run the model repo's own code for its config and tokenizer")
    # None: as the checkpoint is (a GGUF file and AWQ/GPTQ checkpoints stay quantized); "int8" / "int4":
    # quantize a 16-bit checkpoint's linear weights while loading. vLLM's name and values.
    quantization: str | None = _flag(
        None, "weights format; a GGUF file or an AWQ/GPTQ checkpoint needs no flag; int8/int4 quantize a 16-bit "
        "checkpoint while loading", choices=method_names(), aliases=("-q",))
    # "auto": the KV cache in the model dtype; "fp8" / "fp8_e4m3": one byte per value (e4m3, per-tensor
    # scale 1.0 as vLLM's default without calibrated scales), twice the tokens in the same memory.
    # fp8_e5m2 is a choice only so that the start-up error can say it is not supported.
    kv_cache_dtype: str = _flag(
        defaults.KV_CACHE_DTYPE, "auto: the model dtype; fp8 (e4m3): one byte per cached value, twice the tokens "
        "in the same memory (vLLM's flag; e5m2 is not supported)", choices=(*KV_CACHE_DTYPES, "fp8_e5m2"))
    revision: str | None = _flag(
        None, "which snapshot of a repo id in the HF cache to serve: a branch, tag or commit")
    download_dir: str | None = _flag(
        None, "the Hugging Face cache folder to find repo ids in (default: the usual HF cache)")
    # Weights used as stored (safetensors tensors, a GGUF's block weights) stay pages of the memory-mapped file,
    # shared with the OS's file cache and dropped and re-read by it under memory pressure (llama.cpp's
    # default); no_mmap reads each into memory of its own instead (a file on a slow or network disk).
    no_mmap: bool = _flag(False, "read the weights into memory of their own instead of memory-mapping the model "
                                 "file (default: mapped, its pages shared with the OS's file cache)")
    # "pooling" is not a choice: it comes from vLLM's --runner (launcher._task)
    task: str = _flag(
        "auto", "generate (text), embed (/v1/embeddings) or score (/rerank, /score: cross-encoders); auto: from "
        "the checkpoint (vLLM's --task)", choices=("auto", "generate", "embed", "embedding", "score"))
    max_logprobs: int = _flag(
        20, "most top logprobs a request may ask for (default 20; -1: the whole vocabulary)")
    # One LoRA adapter merged into the weights at load (loader/lora.py); the server's --lora-modules serves
    # several by name, each an engine of the model pool.
    lora_path: str | None = _flag(
        None, "a LoRA adapter folder (PEFT's format) merged into the model's 16/32-bit weights as they load "
        "(`wslm serve --lora-modules NAME=PATH` serves adapters by name)")
    # Images in chat (vision models; frontend/images.py): vLLM's --limit-mm-per-prompt, and wslm's own caps.
    limit_mm_per_prompt: str | None = _flag(
        None, 'most images per prompt, as JSON: \'{"image": N}\' (vLLM\'s flag; default 8)')
    max_image_bytes: int = _flag(20 * 2**20, "largest image a request may send, in bytes (encoded; also the cap "
                                             "on an http(s) image download; default 20 MiB)")
    max_image_pixels: int = _flag(16_000_000, "largest image a request may send, in pixels (width x height; "
                                              "default 16 million)")
    image_fetch_timeout: float = _flag(10.0, "seconds to fetch an http(s) image URL (default 10)")
    mm_processor_kwargs: str | None = _flag(
        None, 'the image processor\'s settings over the checkpoint\'s, as JSON (vLLM\'s flag), e.g. '
        '\'{"max_pixels": 1003520}\' (Qwen2.5-VL: at most ~1280 tokens an image)')
    # LoRA adapters per request over this one base (wslm/backend/lora): a request names its adapter
    # (LoRARequest; the server's `model` field), and a step mixes requests of different adapters and the base.
    enable_lora: bool = _flag(False, "serve LoRA adapters per request over the one base model (vLLM's switch)")
    max_loras: int = _flag(4, "LoRA adapters resident at once, and at most in one step (the least recently used "
                              "idle one makes room; default 4)")
    max_lora_rank: int = _flag(16, "highest LoRA rank served (default 16, vLLM's); a higher one is refused")
    max_cpu_loras: int | None = _flag(None, "on a GPU, adapters also kept parsed in host memory (default: "
                                             "max-loras)")
    # vLLM's speculative decoding config (spec_decode/config.py): {"method": "ngram", "num_speculative_tokens": K,
    # "prompt_lookup_max": N, "prompt_lookup_min": M} or {"model": PATH, "num_speculative_tokens": K}; a dict, or
    # its JSON text (the flag).
    speculative_config: dict | str | None = _flag(
        None, 'speculative decoding, as vLLM: \'{"method": "ngram", "num_speculative_tokens": 4, '
        '"prompt_lookup_max": 4}\' (prompt lookup) or \'{"model": PATH, "num_speculative_tokens": 4}\' (a draft '
        "model with the same tokenizer)")

    def speculative(self):
        """The parsed speculative_config (spec_decode.config.SpeculativeConfig), or None when off."""
        from wslm.backend.spec_decode.config import parse_speculative_config

        return parse_speculative_config(self.speculative_config)

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be at least 1, got {self.tensor_parallel_size}.")
        backend = self.distributed_executor_backend
        if backend not in (None, "mp", "ray", "uni") and not (isinstance(backend, str) and ":" in backend):
            raise ValueError(
                f"distributed_executor_backend must be uni, mp, ray or 'package.module:Class', got {backend!r}."
            )
        if self.task not in ("auto", "generate", "embed", "embedding", "pooling", "score"):
            raise ValueError(f"task must be auto, generate, embed or score, got {self.task!r}.")
        if self.block_size not in (8, 16, 32, 64, 128):
            raise ValueError(f"block_size must be one of 8, 16, 32, 64, 128, got {self.block_size}.")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {self.max_num_seqs}.")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be at least 1, got {self.max_num_batched_tokens}.")
        if self.long_prefill_token_threshold is not None and self.long_prefill_token_threshold < 1:
            raise ValueError(
                f"long_prefill_token_threshold must be at least 1, got {self.long_prefill_token_threshold}."
            )
        if self.fanout_per_step < 1:
            raise ValueError(f"fanout_per_step must be at least 1, got {self.fanout_per_step}.")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}.")
        if self.lora_path and self.tensor_parallel_size > 1:
            raise ValueError("a LoRA adapter (lora_path) cannot be merged under tensor parallelism yet: serve it at "
                             "--tensor-parallel-size 1, or merge it with peft (merge_and_unload) first.")
        if self.enable_lora and self.tensor_parallel_size > 1:
            raise ValueError("LoRA adapters per request (enable_lora) run on one device: use "
                             "--tensor-parallel-size 1, or merge the adapter with peft (merge_and_unload) first.")
        if self.max_loras < 1 or self.max_lora_rank < 1:
            raise ValueError(f"max_loras and max_lora_rank must be at least 1, got {self.max_loras} and "
                             f"{self.max_lora_rank}.")
        spec = self.speculative()  # ValueError naming the fix
        if spec is not None and self.tensor_parallel_size > 1:
            raise ValueError("speculative decoding (speculative_config) runs at --tensor-parallel-size 1 for now: "
                             "drop one of the two.")
        if spec is not None and ":" in (self.distributed_executor_backend or ""):
            raise ValueError("speculative decoding (speculative_config) runs in wslm's single-device executor, not "
                             "in an executor class of your own: drop one of the two.")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be positive, got {self.max_model_len}.")
        from wslm.backend.quant import check_quantization

        self.quantization = check_quantization(self.quantization)
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            hint = " (e5m2 is not supported: use fp8, which is e4m3)" if self.kv_cache_dtype == "fp8_e5m2" else ""
            raise ValueError(
                f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}{hint}."
            )
        if self.dtype not in ("auto", "float32", "float16", "bfloat16", "half", "float", "fp32", "fp16", "bf16"):
            raise ValueError(f"dtype must be auto, float32, float16 or bfloat16, got {self.dtype!r}.")
