"""Reads a model's config and tokenizer and yields its weights, whatever the format (see model_source for
where the files are)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from wslm.backend.loader.model_source import ModelSource, resolve_model  # noqa: F401  (resolve_model re-exported)
from wslm.backend.modeling import (
    GGUF_ARCHITECTURES,
    SUPPORTED_ARCHITECTURES,
    get_model_class,
    gguf_architecture,
)
from wslm.backend.modeling.config import ModelConfig, rope_parameters, rope_settings  # noqa: F401 (re-exported)

logger = logging.getLogger(__name__)


def _read_hf_config(source: ModelSource, trust_remote_code: bool):
    converted = _converted(source)
    if converted is not None:
        return _converted_config(converted)
    from transformers import AutoConfig  # (its import alone costs ~0.5 s: transformers.models' index)

    if not source.gguf_file:
        return AutoConfig.from_pretrained(str(source.folder), trust_remote_code=trust_remote_code)
    from wslm.backend.loader.gguf_config import complete_config

    hf_config = AutoConfig.from_pretrained(str(source.folder), gguf_file=source.gguf_file)
    complete_config(hf_config, source.gguf_path)  # the keys transformers' reader skips (Phi-3, Gemma)
    return hf_config


def _converted(source: ModelSource):
    """A GGUF's converted tokenizer and config (gguf_cache), made by a child process on the first start."""
    converted = source.converted()
    if converted is None and source.gguf_file:
        from wslm.backend.loader import gguf_cache

        if gguf_cache.enabled():
            converted = gguf_cache.convert(source.gguf_path)
    return converted


# In a GGUF's converted copy: the class AutoTokenizer chose for that folder and the transformers version that
# chose it, written at its first load.
TOKENIZER_CLASS_FILE = "wslm_tokenizer_class.txt"
# Beside it: the config's every field as the family's class resolved them, and that transformers version.
CONFIG_FIELDS_FILE = "wslm_config_fields.json"


def _converted_config(folder: Path):
    """The converted copy's config. AutoConfig imports the model family's config module, which pulls in
    transformers' model-loading and torch.distributed.tensor (~1 s of a 2 s start). Once the family's class
    has resolved the folder's config, its fields (defaults and derived ones included, aliases too) are noted;
    later starts with the same transformers build a plain PretrainedConfig of them: the same attributes the
    engine reads, without the import. Families with nested configs (text + vision) always take the class."""
    from importlib.metadata import version

    note, here = folder / CONFIG_FIELDS_FILE, version("transformers")
    try:
        saved = json.loads(note.read_text())
        if saved.get("transformers") == here and isinstance(saved.get("fields"), dict):
            from transformers.configuration_utils import PretrainedConfig

            return PretrainedConfig(**saved["fields"])
    except (OSError, ValueError, TypeError):  # no note, or not one this transformers can read: ask again
        pass
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(str(folder))
    cls = type(hf_config)
    if not getattr(cls, "sub_configs", None):
        fields = hf_config.to_dict()
        for alias, target in (getattr(cls, "attribute_map", None) or {}).items():
            fields.setdefault(alias, fields.get(target))
        try:
            note.write_text(json.dumps({"transformers": here, "class": cls.__name__, "fields": fields}))
        except (OSError, TypeError, ValueError):  # a read-only cache, or a field JSON can't hold: ask every time
            pass
    return hf_config


def load_tokenizer(source: ModelSource, tokenizer: str | None = None, trust_remote_code: bool = False):
    if tokenizer:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(tokenizer, trust_remote_code=trust_remote_code)
    converted = _converted(source)
    if converted is not None:
        return _converted_tokenizer(converted)
    from transformers import AutoTokenizer

    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    return AutoTokenizer.from_pretrained(str(source.folder), trust_remote_code=trust_remote_code, **kwargs)


def _converted_tokenizer(folder: Path):
    """The converted copy's tokenizer. AutoTokenizer reads the folder's config (importing the model family's
    config module: ~1 s of a 3 s start) to choose the class; once it has chosen the plain TokenizersBackend
    for this folder, later starts with the same transformers load that class straight away (the same files,
    so the same tokenizer). The note names the class and the transformers version that chose it."""
    from importlib.metadata import version

    marker = folder / TOKENIZER_CLASS_FILE
    here = version("transformers")
    try:
        chosen, _, by = marker.read_text().strip().partition(" ")
    except OSError:
        chosen, by = "", ""
    if chosen == "TokenizersBackend" and by == here:
        from transformers import TokenizersBackend

        return TokenizersBackend.from_pretrained(str(folder))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    if (chosen, by) != (type(tok).__name__, here):
        try:
            marker.write_text(f"{type(tok).__name__} {here}")
        except OSError:  # a read-only cache: every start asks AutoTokenizer
            pass
    return tok


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
        from wslm.backend.platforms.cpu.tuning import cpu_auto_dtype

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
    from wslm.backend.platforms.cpu.tuning import cpu_auto_dtype

    return cpu_auto_dtype()[0] == "bfloat16"


def check_prequantized(method: str, qc: dict) -> None:
    """Whether the `method` checkpoint's variant loads (QuantMethod.check_checkpoint): ValueError naming the
    cause and the fix."""
    from wslm.backend.quant.registry import get_method

    get_method(method).check_checkpoint(qc)


def resolve_quantization(requested: str | None, source: ModelSource, hf_config) -> str | None:
    """What the weights are, as the checkpoint's format answers (QuantMethod.resolve): a GGUF file is "gguf"
    whatever was asked; a checkpoint with a quantization_config is its method (as vLLM reads it); int8/int4
    quantize 16-bit weights on load."""
    from wslm.backend.quant import check_quantization
    from wslm.backend.quant.registry import detect_method, resolve

    requested = check_quantization(requested)
    qc = getattr(hf_config, "quantization_config", None)
    qc = (qc if isinstance(qc, dict) else vars(qc)) if qc else None
    if source.gguf_file:
        stored = detect_method(None, source.gguf_file)
    else:
        stored = detect_method(qc)
    return resolve(requested, stored, qc)


def load_model_config(
    source: ModelSource, tokenizer, dtype: str, device: torch.device, trust_remote_code=False, quantization=None
):
    hf_config = _read_hf_config(source, trust_remote_code)
    archs = list(getattr(hf_config, "architectures", None) or [])
    if not archs:
        model_type = gguf_architecture(getattr(hf_config, "model_type", ""))
        archs = [GGUF_ARCHITECTURES.get(model_type, model_type or "unknown")]
    arch = archs[0]
    # A bare decoder body (Qwen3Model, as embedding checkpoints ship) runs on its causal-LM family's code.
    if arch.endswith("Model") and arch.removesuffix("Model") + "ForCausalLM" in SUPPORTED_ARCHITECTURES:
        arch = arch.removesuffix("Model") + "ForCausalLM"
    model_cls = get_model_class(arch)  # ValueError naming the supported list
    if source.gguf_file and arch not in GGUF_ARCHITECTURES.values():
        # The family runs from safetensors, but this GGUF's tensor names/layout are not mapped yet.
        raise ValueError(
            f"GGUF files of {arch} are not supported yet (GGUF architectures supported: "
            f"{', '.join(GGUF_ARCHITECTURES)}). Use the model's Hugging Face (safetensors) repository instead."
        )
    if source.gguf_file and source.converted() is None:
        from wslm.backend.loader import gguf_cache

        if gguf_cache.enabled():
            gguf_cache.save_tokenizer_and_config(gguf_cache.folder_for(source.gguf_path), tokenizer, hf_config, arch)
    # Multimodal checkpoints (Gemma 3) nest the language model's settings; text models return themselves.
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    mmproj = None
    if source.mmproj is not None:  # a GGUF with llama.cpp's vision projector: the family's vision class
        from wslm.backend.loader.mmproj_pair import pair_architecture

        arch, mmproj = pair_architecture(source, arch, text.hidden_size)
    num_heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // num_heads
    rope = rope_parameters(text)
    theta, scaling = rope_settings(rope, text)
    partial = float(rope.get("partial_rotary_factor") or getattr(text, "partial_rotary_factor", None) or 1.0)
    layer_types = getattr(text, "layer_types", None)
    fields = dict(
        name=source.name,
        path=str(source.folder / source.gguf_file) if source.gguf_file else str(source.folder),
        architecture=arch,
        hidden_size=text.hidden_size,
        num_layers=text.num_hidden_layers,
        num_heads=num_heads,
        num_kv_heads=getattr(text, "num_key_value_heads", None) or num_heads,
        head_dim=head_dim,
        intermediate_size=text.intermediate_size,
        vocab_size=text.vocab_size,
        rms_norm_eps=float(getattr(text, "rms_norm_eps", None) or 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(getattr(text, "max_position_embeddings", 4096) or 4096),
        tie_word_embeddings=bool(
            getattr(hf_config, "tie_word_embeddings", None) or getattr(text, "tie_word_embeddings", False)
        ),
        qkv_bias=bool(getattr(text, "attention_bias", False)),
        eos_token_ids=_eos_ids(source, hf_config, tokenizer),
        dtype=resolve_dtype(dtype, hf_config, device),
        sliding_window=_sliding_window(text),
        layer_types=tuple(layer_types) if layer_types else None,
        rotary_dim=int(head_dim * partial),
        hidden_act=getattr(text, "hidden_activation", None) or getattr(text, "hidden_act", None) or "silu",
        quantization=resolve_quantization(quantization, source, hf_config),
        mmproj=mmproj,
    )
    fields.update(model_cls.config_overrides(text))
    return hf_config, ModelConfig(**fields)


def _sliding_window(hf_config) -> int | None:
    window = getattr(hf_config, "sliding_window", None)
    if not isinstance(window, int) or window <= 0:
        return None
    # Qwen2 configs carry a window but switch it off with use_sliding_window=False.
    if getattr(hf_config, "use_sliding_window", True) is False:
        return None
    return window


def iter_weights(source: ModelSource, dtype: torch.dtype, quantization: str | None = None, no_mmap: bool = False):
    """Yield (hf_name, tensor) for every weight, one file at a time to keep peak memory low, logging load
    progress (load_progress.py). The checkpoint's own format (registry.stored_method) reads them: a format's
    file (GGUF) by itself, a folder's safetensors / .bin files through its iter_weights (AWQ/GPTQ pieces come
    out as one int4 weight per linear). Safetensors, and a GGUF's block weights, come memory-mapped
    (safetensors_mmap.py, quant/gguf_blocks.py) unless no_mmap: each tensor then is a private copy.
    `quantization` (what the model runs as) is not needed: on-the-fly formats quantize in the layers."""
    from wslm.backend.loader.load_progress import LoadProgress, track
    from wslm.backend.quant.registry import DENSE, stored_method

    method = stored_method(source) or DENSE
    sizes = method.stored_bytes(source)
    if sizes is None:
        yield from method.iter_weights(source, dtype, no_mmap, lambda: _iter_folder(source, no_mmap))
        return
    progress = LoadProgress(sum(sizes.values()), source.name)
    yield from track(_trimmed(method.iter_weights(source, dtype, no_mmap, None)), progress,
                     lambda name, _item: sizes.get(name, 0))


def _iter_folder(source: ModelSource, no_mmap: bool):
    """A checkpoint folder's raw tensors: its safetensors files, else its pytorch_model*.bin files."""
    from wslm.backend.loader.load_progress import LoadProgress, track

    files = sorted(source.folder.glob("*.safetensors"))
    if files:
        from wslm.backend.loader.safetensors_mmap import stored_bytes

        by_file = [(file, stored_bytes(file)) for file in files]
        progress = LoadProgress(sum(sum(sizes.values()) for _, sizes in by_file), source.name)
        for file, sizes in by_file:
            yield from track(_iter_safetensors(file, no_mmap), progress,
                             lambda name, _t, sizes=sizes: sizes.get(name, 0), finish=False)
        progress.finish()
        return
    bins = sorted(source.folder.glob("pytorch_model*.bin"))
    if not bins:
        raise FileNotFoundError(f"No weights (*.safetensors or pytorch_model*.bin) in {source.folder}.")
    progress = LoadProgress(sum(f.stat().st_size for f in bins), source.name)
    for file in bins:
        items = torch.load(str(file), map_location="cpu", weights_only=True).items()
        yield from track(items, progress, lambda _name, t: t.numel() * t.element_size(), finish=False)
    progress.finish()


def _iter_safetensors(file, no_mmap: bool):
    if not no_mmap:
        from wslm.backend.loader.safetensors_mmap import iter_mapped

        yield from iter_mapped(file)
        return
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as f:
        for name in f.keys():
            # get_tensor itself is a view of safetensors' own mapping (0.6 and later): copied to be private.
            yield name, f.get_tensor(name).clone()


def _trimmed(weights):
    """A format's own file read tensor by tensor (GGUF), the freed heap handed back around each one."""
    for item in weights:
        return_freed_heap()  # what reading the tensor left, before the model packs it
        yield item
        del item
        return_freed_heap()  # what packing it left


def return_freed_heap() -> None:
    """Hand freed heap back to the system. Repacking a tensor makes buffers of a few MB, and glibc keeps
    freed heap mapped (its mmap threshold rises to the largest buffer freed, so later ones come from the
    heap, between the weights already kept): by the end of the demo GGUF's load ~150 MB of it (1.6x the
    weights) was still resident, and counted in the peak. Trimming around each tensor keeps the peak at the
    weights plus one tensor's buffers; a call takes ~0.1 ms."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl): nothing to trim
        pass


def decoder_body_weights(weights):
    """A bare decoder body (Qwen3Model: `layers.0...`, `norm.weight`) named as our causal-LM loader
    expects (`model.` in front)."""
    for name, tensor in weights:
        yield (name if name.startswith(("model.", "lm_head.")) else "model." + name), tensor
