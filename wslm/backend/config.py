"""EngineConfig: every knob of the engine, named after vLLM's engine arguments."""

from __future__ import annotations

from dataclasses import dataclass

# vLLM's --kv-cache-dtype values that wslm runs.
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048  # also what `wslm models info` assumes when it sizes a windowed pool

@dataclass(slots=True)
class EngineConfig:
    model: str = "demo"  # "demo", a HF folder, a .gguf file, a repo id in the HF cache, or a `wslm models` id
    tokenizer: str | None = None
    max_model_len: int | None = None  # None: the model's own, capped by what the KV pool holds
    max_num_seqs: int = 128
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS  # the per-step token budget (chunked prefill)
    # Fairness (scheduler.py): while streams decode, prefill gets at most this many tokens per step
    # (None: max_num_batched_tokens // 8), and one request adds at most fanout_per_step sequences per step.
    long_prefill_token_threshold: int | None = None
    fanout_per_step: int = 16
    block_size: int = 16
    enable_prefix_caching: bool = True
    device: str = "auto"  # "auto", "cpu", "cuda", "cuda:N"
    dtype: str = "auto"  # auto: bf16 on GPUs (fp16 for fp16 models) and on bf16-native CPUs, else fp32
    gpu_memory_utilization: float = 0.9  # CUDA: share of the card the engine may use
    kv_cache_memory: int | None = None  # CPU: bytes for the KV pool (None: from free RAM)
    num_gpu_blocks_override: int | None = None  # exact pool size in blocks (tests, tuning)
    chat_template: str | None = None  # a Jinja template, or a path to one
    seed: int = 0
    tensor_parallel_size: int = 1
    distributed_executor_backend: str | None = None  # "mp" (one machine, default) or "ray" (a Ray cluster)
    enforce_eager: bool = False  # no CUDA graphs, no compiled CPU decode step
    trust_remote_code: bool = False
    # None: as the checkpoint is (a GGUF file and AWQ/GPTQ checkpoints stay quantized); "int8" / "int4":
    # quantize a 16-bit checkpoint's linear weights while loading. vLLM's name and values.
    quantization: str | None = None
    # "auto": the KV cache in the model dtype; "fp8" / "fp8_e4m3": one byte per value (e4m3, per-tensor
    # scale 1.0 as vLLM's default without calibrated scales), twice the tokens in the same memory.
    kv_cache_dtype: str = "auto"
    revision: str | None = None  # a repo id's snapshot in the HF cache: branch, tag or commit (vLLM's --revision)
    download_dir: str | None = None  # the HF cache folder to find repo ids in (vLLM's --download-dir)
    task: str = "auto"  # "generate", "embed", "score" or "auto" (from the checkpoint), as vLLM's --task
    max_logprobs: int = 20  # most top logprobs one request may ask for (vLLM's --max-logprobs; -1: vocabulary)

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be at least 1, got {self.tensor_parallel_size}.")
        if self.distributed_executor_backend not in (None, "mp", "ray", "uni"):
            raise ValueError(
                f"distributed_executor_backend must be mp or ray, got {self.distributed_executor_backend!r}."
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
