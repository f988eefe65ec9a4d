"""Reads a model's config and tokenizer and yields its weights, whatever the format (see model_source for
where the files are)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import torch

from wslm.backend.model_source import ModelSource, resolve_model  # noqa: F401  (resolve_model re-exported)
from wslm.backend.modeling import GGUF_ARCHITECTURES, SUPPORTED_ARCHITECTURES, unsupported_message

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class ModelConfig:
    """The handful of architecture facts our model code needs, read from any source format."""

    name: str
    path: str
    architecture: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    eos_token_ids: frozenset[int]
    dtype: torch.dtype
    max_model_len: int = 0  # resolved by the engine
    # Mistral v0.1-style sliding-window attention, which our kernels do not implement: the engine keeps
    # the context within the window, where full attention gives the same result.
    sliding_window: int | None = None
    # None (dense), "gguf", "awq", "gptq", "int8" or "int4": how the linear weights are held (wslm.backend.quant).
    quantization: str | None = None

    def kv_bytes_per_token(self, dtype: torch.dtype | None = None) -> int:
        elem = torch.empty(0, dtype=dtype or self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem


def _read_hf_config(source: ModelSource, trust_remote_code: bool):
    from transformers import AutoConfig

    converted = source.converted()
    if converted is not None:
        return AutoConfig.from_pretrained(str(converted))
    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    return AutoConfig.from_pretrained(str(source.folder), trust_remote_code=trust_remote_code, **kwargs)


def load_tokenizer(source: ModelSource, tokenizer: str | None = None, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    if tokenizer:
        return AutoTokenizer.from_pretrained(tokenizer, trust_remote_code=trust_remote_code)
    converted = source.converted()
    if converted is not None:
        return AutoTokenizer.from_pretrained(str(converted))
    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    return AutoTokenizer.from_pretrained(str(source.folder), trust_remote_code=trust_remote_code, **kwargs)


def _rope_settings(hf_config) -> tuple[float, dict | None]:
    # transformers 5 folds rope_theta and rope_scaling into rope_parameters; 4.x keeps them apart.
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    scaling = getattr(hf_config, "rope_scaling", None)
    if isinstance(scaling, dict):
        params = {**scaling, **params}
    theta = float(params.pop("rope_theta", None) or getattr(hf_config, "rope_theta", None) or 10000.0)
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type == "default":
        return theta, None
    params["rope_type"] = rope_type
    return theta, params


def _eos_ids(source: ModelSource, hf_config, tokenizer) -> frozenset[int]:
    ids: set[int] = set()

    def add(value) -> None:
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(v for v in value if isinstance(v, int))

    add(getattr(hf_config, "eos_token_id", None))
    add(getattr(tokenizer, "eos_token_id", None))
    gen_cfg = source.folder / "generation_config.json"
    if not source.gguf_file and gen_cfg.is_file():
        add(json.loads(gen_cfg.read_text()).get("eos_token_id"))
    return frozenset(ids)


def resolve_dtype(requested: str, hf_config, device: torch.device) -> torch.dtype:
    names = {
        "float32": torch.float32, "float": torch.float32, "fp32": torch.float32,
        "float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
        "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    }  # fmt: skip
    if requested != "auto":
        return names[requested]
    if device.type == "cpu":
        from wslm.backend.cpu_tuning import cpu_auto_dtype

        name, why = cpu_auto_dtype()
        logger.info("dtype=auto on CPU: %s, because %s.", name, why)
        return names[name]
    cfg = getattr(hf_config, "torch_dtype", None) or getattr(hf_config, "dtype", None)
    cfg = names.get(str(cfg).removeprefix("torch."), torch.float32) if cfg is not None else torch.float32
    if cfg == torch.float32:
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return cfg


def cpu_has_amx_bf16() -> bool:
    """True where dtype=auto picks bfloat16 on this CPU (AMX or AVX512-BF16; name kept for callers)."""
    from wslm.backend.cpu_tuning import cpu_auto_dtype

    return cpu_auto_dtype()[0] == "bfloat16"


def resolve_quantization(requested: str | None, source: ModelSource, hf_config) -> str | None:
    """What the weights are: a GGUF file is "gguf" whatever was asked; a checkpoint with a
    quantization_config is its method (as vLLM reads it); int8/int4 quantize 16-bit weights on load."""
    from wslm.backend.quant import check_quantization

    requested = check_quantization(requested)
    if source.gguf_file:
        # int8/int4 apply to the dense tensors of a GGUF (all of them under WSLM_GGUF_DEQUANTIZE=1).
        return requested if requested in ("int8", "int4") else "gguf"
    qc = getattr(hf_config, "quantization_config", None)
    found = (qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)) if qc else None
    found = str(found).lower() if found else None
    if found in ("awq", "gptq"):
        if requested not in (None, found):
            raise ValueError(f"This checkpoint is {found}-quantized; quantization={requested!r} cannot apply to it.")
        return found
    if found:
        raise ValueError(f"Checkpoints quantized with {found!r} are not supported (supported: awq, gptq, gguf).")
    if requested in ("awq", "gptq", "gguf"):
        raise ValueError(f"quantization={requested!r} was asked for, but the checkpoint has no {requested} weights.")
    return requested


def load_model_config(
    source: ModelSource, tokenizer, dtype: str, device: torch.device, trust_remote_code=False, quantization=None
):
    hf_config = _read_hf_config(source, trust_remote_code)
    archs = list(getattr(hf_config, "architectures", None) or [])
    if not archs:
        model_type = getattr(hf_config, "model_type", "")
        archs = [GGUF_ARCHITECTURES.get(model_type, model_type or "unknown")]
    arch = archs[0]
    # A bare decoder body (Qwen3Model, as embedding checkpoints ship) runs on its causal-LM family's code.
    if arch.endswith("Model") and arch.removesuffix("Model") + "ForCausalLM" in SUPPORTED_ARCHITECTURES:
        arch = arch.removesuffix("Model") + "ForCausalLM"
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(unsupported_message(arch))
    if source.gguf_file and source.converted() is None:
        from wslm.backend import gguf_cache

        if gguf_cache.enabled():
            gguf_cache.save_tokenizer_and_config(gguf_cache.folder_for(source.gguf_path), tokenizer, hf_config, arch)
    num_heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
    theta, scaling = _rope_settings(hf_config)
    return hf_config, ModelConfig(
        name=source.name,
        path=str(source.folder / source.gguf_file) if source.gguf_file else str(source.folder),
        architecture=arch,
        hidden_size=hf_config.hidden_size,
        num_layers=hf_config.num_hidden_layers,
        num_heads=num_heads,
        num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
        head_dim=head_dim,
        intermediate_size=hf_config.intermediate_size,
        vocab_size=hf_config.vocab_size,
        rms_norm_eps=float(hf_config.rms_norm_eps),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(getattr(hf_config, "max_position_embeddings", 4096) or 4096),
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        qkv_bias=SUPPORTED_ARCHITECTURES[arch]["qkv_bias"] or bool(getattr(hf_config, "attention_bias", False)),
        eos_token_ids=_eos_ids(source, hf_config, tokenizer),
        dtype=resolve_dtype(dtype, hf_config, device),
        sliding_window=_sliding_window(hf_config),
        quantization=resolve_quantization(quantization, source, hf_config),
    )


def _sliding_window(hf_config) -> int | None:
    window = getattr(hf_config, "sliding_window", None)
    if not isinstance(window, int) or window <= 0:
        return None
    # Qwen2 configs carry a window but switch it off with use_sliding_window=False.
    if getattr(hf_config, "use_sliding_window", True) is False:
        return None
    return window


def iter_weights(source: ModelSource, dtype: torch.dtype, quantization: str | None = None):
    """Yield (hf_name, tensor) for every weight, one file at a time to keep peak memory low. AWQ/GPTQ
    pieces come out as one int4 weight per linear (wslm.backend.quant.packed_checkpoint)."""
    if quantization in ("awq", "gptq"):
        from wslm.backend.quant.packed_checkpoint import read_quant_config, repack

        yield from repack(iter_weights(source, dtype), quantization, read_quant_config(source.folder))
        return
    if source.gguf_file:
        yield from _iter_gguf_weights(source, dtype)
        return
    files = sorted(source.folder.glob("*.safetensors"))
    if files:
        from safetensors import safe_open

        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        return
    bins = sorted(source.folder.glob("pytorch_model*.bin"))
    if not bins:
        raise FileNotFoundError(f"No weights (*.safetensors or pytorch_model*.bin) in {source.folder}.")
    for file in bins:
        yield from torch.load(str(file), map_location="cpu", weights_only=True).items()


def _iter_gguf_weights(source: ModelSource, dtype: torch.dtype):
    # Read straight from the file, tensor by tensor, kept quantized (wslm.backend.quant.gguf_weights):
    # faster than reading a converted copy back, and the model never exists in full precision. The
    # converted-copy cache keeps only the tokenizer and config, the slow part to parse.
    from wslm.backend.quant.gguf_weights import iter_gguf_weights

    yield from iter_gguf_weights(source.gguf_path)
