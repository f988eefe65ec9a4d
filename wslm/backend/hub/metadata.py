"""Cheap model metadata, never loading weights: config.json (+ safetensors headers) for HF folders, the
GGUF header (through gguf's GGUFReader) for .gguf files.

GGUFReader parses the whole vocabulary, which takes a second or two on a large file, so GGUF results are
kept in a small JSON cache keyed by path, size and mtime."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model", "tokenizer.tiktoken")
_SHARD_RE = re.compile(r"-(\d{5})-of-(\d{5})(\.safetensors|\.bin)$")
SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
# 2: elements_by_type, 3: MLP widths and quant_group_size, 4: MoE experts at 16 bits, 5: experts kept quantized
_CACHE_VERSION = 5


@dataclass
class ModelMetadata:
    architecture: str | None = None  # HF class name, e.g. LlamaForCausalLM (GGUF names are mapped)
    gguf_architecture: str | None = None  # general.architecture, e.g. "llama"
    num_params: int | None = None
    dtype: str | None = None
    quantization: str | None = None
    context_length: int | None = None
    num_layers: int | None = None
    hidden_size: int | None = None
    num_attention_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    # What wslm.tp_sizes needs to offer the tensor-parallel sizes the engine accepts.
    intermediate_size: int | None = None
    moe_intermediate_size: int | None = None  # each routed expert's width (MoE)
    shared_expert_intermediate_size: int | None = None
    quant_group_size: int | None = None  # 4-bit groups kept under tensor parallelism (AWQ/GPTQ, GGUF)
    quant_config: dict | None = None  # config.json's quantization_config (its format's method reads it)
    vocab_size: int | None = None
    uniform_sliding_window: int | None = None  # every layer windowed: the KV pool holds only the window
    has_tokenizer: bool = False
    has_chat_template: bool = False
    weight_files: list[str] = field(default_factory=list)
    tensor_types: list[str] = field(default_factory=list)  # GGUF: every storage type used (F32, Q4_K ...)
    elements_by_type: dict[str, int] = field(default_factory=dict)  # GGUF: weights per storage type
    missing_files: list[str] = field(default_factory=list)  # weight shards named in an index but absent
    name: str | None = None
    error: str | None = None

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int | None:
        """K and V for every layer, at 16 bits per value unless told otherwise."""
        if not (self.num_layers and self.num_kv_heads and self.head_dim):
            return None
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


# --- HF folders -------------------------------------------------------------------------------------


def _dtype_from_config(config: dict) -> str | None:
    dtype = config.get("torch_dtype") or config.get("dtype")
    if dtype is None and isinstance(config.get("text_config"), dict):
        return _dtype_from_config(config["text_config"])
    return str(dtype).replace("torch.", "") if dtype else None


def _stored_method(quant_config: dict | None, file_name: str | None = None):
    """The weight format a checkpoint is stored in (wslm.backend.quant.registry), None when dense or when no
    registered format reads it (catalog._support says so)."""
    from wslm.backend.quant.registry import detect_method

    try:
        return detect_method(quant_config, file_name)
    except ValueError:
        return None


def _quantization_from_config(config: dict) -> str | None:
    q = config.get("quantization_config")
    if not isinstance(q, dict):
        return None
    method = str(q.get("quant_method") or "quantized")
    bits = (
        q.get("bits")
        or q.get("w_bit")
        or (4 if q.get("load_in_4bit") else 8 if q.get("load_in_8bit") else None)
    )
    return f"{method}-{bits}bit" if bits else method


def _params_from_config(c: dict) -> int | None:
    """Llama-family estimate when no safetensors header can be read (e.g. pytorch_model.bin only)."""
    try:
        h, n, v, inter = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["intermediate_size"]
    except KeyError:
        return None
    heads = c.get("num_attention_heads") or 1
    kv = c.get("num_key_value_heads") or heads
    hd = c.get("head_dim") or h // heads
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    mlp = 3 * h * inter
    emb = v * h * (1 if c.get("tie_word_embeddings") else 2)
    return n * (attn + mlp + 2 * h) + emb + h


def _safetensors_header(path: Path) -> dict:
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > 100 * 1024 * 1024:
            raise ValueError("safetensors header too large")
        return json.loads(f.read(length))


def weight_files(folder: Path) -> tuple[list[str], list[str]]:
    """Weight files of an HF folder (safetensors preferred), and any shard an index names but lacks."""
    for index_name, suffix in (
        ("model.safetensors.index.json", ".safetensors"),
        ("pytorch_model.bin.index.json", ".bin"),
    ):
        index = folder / index_name
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError):
                shards = sorted(p.name for p in folder.glob(f"*{suffix}"))
            present = [s for s in shards if (folder / s).exists()]
            return present, [s for s in shards if s not in present]
    for pattern in ("*.safetensors", "pytorch_model*.bin", "*.pt", "*.pth"):
        files = sorted(p.name for p in folder.glob(pattern) if p.exists())
        if files:
            # No index (yet): shard names still say how many there should be.
            missing = []
            for name in files:
                m = _SHARD_RE.search(name)
                if m:
                    total, stem, ext = int(m.group(2)), name[: m.start()], m.group(3)
                    wanted = [f"{stem}-{i:05d}-of-{total:05d}{ext}" for i in range(1, total + 1)]
                    missing += [w for w in wanted if w not in files and w not in missing]
            return files, missing
    return [], []


def _int(value) -> int | None:
    """A width from a config: an int, or None (absent, or per-layer lists some configs carry)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


# Families whose config.json gives one window for every layer without listing layer_types (Mistral v0.1,
# Phi-3 minis); others with a window mix full-attention layers in (Gemma 2/3, gpt-oss, Qwen2's max_window_layers).
_ALL_LAYERS_WINDOWED = ("mistral", "phi3")


def _uniform_window(text: dict) -> int | None:
    """The engine's ModelConfig.uniform_sliding_window, read from config.json alone (None when unsure)."""
    window = _int(text.get("sliding_window"))
    if not window or text.get("use_sliding_window") is False:
        return None
    types = text.get("layer_types")
    if isinstance(types, list) and types:
        return window if all(t == "sliding_attention" for t in types) else None
    return window if text.get("model_type") in _ALL_LAYERS_WINDOWED else None


def read_hf_folder(folder: Path) -> ModelMetadata:
    meta = ModelMetadata()
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        meta.error = f"cannot read config.json: {exc}"
        return meta
    archs = config.get("architectures") or []
    meta.architecture = archs[0] if archs else config.get("model_type")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    meta.dtype = _dtype_from_config(config)
    meta.quantization = _quantization_from_config(config)
    meta.context_length = (
        text.get("max_position_embeddings") or text.get("n_positions") or text.get("seq_length")
    )
    meta.num_layers = text.get("num_hidden_layers") or text.get("n_layer")
    meta.hidden_size = text.get("hidden_size") or text.get("n_embd")
    meta.num_attention_heads = text.get("num_attention_heads") or text.get("n_head")
    meta.num_kv_heads = text.get("num_key_value_heads") or meta.num_attention_heads
    if text.get("head_dim"):
        meta.head_dim = text["head_dim"]
    elif meta.hidden_size and meta.num_attention_heads:
        meta.head_dim = meta.hidden_size // meta.num_attention_heads
    meta.vocab_size = text.get("vocab_size")
    meta.uniform_sliding_window = _uniform_window(text)
    meta.intermediate_size = _int(text.get("intermediate_size"))
    meta.moe_intermediate_size = _int(text.get("moe_intermediate_size"))
    meta.shared_expert_intermediate_size = _int(text.get("shared_expert_intermediate_size"))
    q = config.get("quantization_config")
    if isinstance(q, dict):
        meta.quant_config = q
        method = _stored_method(q)
        meta.quant_group_size = method.group_size(q) if method is not None else None
    meta.has_tokenizer = any((folder / name).exists() for name in TOKENIZER_FILES)
    meta.has_chat_template = (folder / "chat_template.jinja").exists() or (
        folder / "chat_template.json"
    ).exists()
    if not meta.has_chat_template:
        try:
            meta.has_chat_template = "chat_template" in json.loads(
                (folder / "tokenizer_config.json").read_text()
            )
        except (OSError, ValueError):
            pass
    meta.weight_files, meta.missing_files = weight_files(folder)
    counted = 0
    try:
        for name in meta.weight_files:
            if not name.endswith(".safetensors"):
                raise ValueError("not safetensors")
            for key, info in _safetensors_header(folder / name).items():
                if key != "__metadata__":
                    counted += _safetensors_params(key, info)
                    if meta.dtype is None:
                        meta.dtype = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}.get(
                            info["dtype"]
                        )
        meta.num_params = counted if counted and not meta.missing_files else _params_from_config(text)
    except (OSError, ValueError, KeyError, struct.error):
        meta.num_params = _params_from_config(text)
    return meta


def _safetensors_params(key: str, info: dict) -> int:
    """Parameters a safetensors entry holds: MXFP4 (gpt-oss) packs two 4-bit values per byte in `_blocks`, and
    its `_scales` are not parameters."""
    n = math.prod(info["shape"])
    if info.get("dtype") == "U8" and key.endswith("_blocks"):
        return 2 * n
    return 0 if info.get("dtype") == "U8" and key.endswith("_scales") else n


# --- GGUF files -------------------------------------------------------------------------------------


def gguf_shards(first: Path) -> list[Path]:
    """All files of a split GGUF (model-00001-of-00003.gguf ...), or just the file itself."""
    m = SPLIT_RE.search(first.name)
    if not m:
        return [first]
    count = int(m.group(2))
    stem = first.name[: m.start()]
    return [first.with_name(f"{stem}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def file_type_label(value: int) -> str | None:
    from gguf import LlamaFileType

    try:
        name = LlamaFileType(int(value)).name
    except ValueError:
        return None
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def _field(reader, key: str):
    f = reader.fields.get(key)
    if f is None:
        return None
    try:
        return f.contents()
    except Exception:  # a malformed field must not hide the rest of the metadata
        return None


def _read_gguf_uncached(path: Path) -> ModelMetadata:
    from collections import Counter

    from gguf import GGUFReader

    from wslm.backend.modeling import GGUF_ARCHITECTURES

    meta = ModelMetadata()
    shards = gguf_shards(path)
    missing = [s.name for s in shards if not s.exists()]
    if missing:
        meta.missing_files = missing
    reader = GGUFReader(path)
    arch = _field(reader, "general.architecture")
    meta.gguf_architecture = arch
    meta.architecture = GGUF_ARCHITECTURES.get(arch, arch)
    meta.name = _field(reader, "general.name")
    meta.context_length = _field(reader, f"{arch}.context_length")
    meta.num_layers = _field(reader, f"{arch}.block_count")
    meta.hidden_size = _field(reader, f"{arch}.embedding_length")
    meta.num_attention_heads = _field(reader, f"{arch}.attention.head_count")
    meta.num_kv_heads = _field(reader, f"{arch}.attention.head_count_kv") or meta.num_attention_heads
    meta.head_dim = _field(reader, f"{arch}.attention.key_length")
    if not meta.head_dim and meta.hidden_size and meta.num_attention_heads:
        meta.head_dim = meta.hidden_size // meta.num_attention_heads
    meta.vocab_size = _field(reader, f"{arch}.vocab_size")
    meta.intermediate_size = _int(_field(reader, f"{arch}.feed_forward_length"))
    meta.moe_intermediate_size = _int(_field(reader, f"{arch}.expert_feed_forward_length"))
    meta.shared_expert_intermediate_size = _int(_field(reader, f"{arch}.expert_shared_feed_forward_length"))
    method = _stored_method(None, Path(path).name)  # the engine runs a GGUF file as its format (gguf)
    meta.quant_group_size = method.group_size(None) if method is not None else None
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is not None:
        meta.has_tokenizer = True
        meta.vocab_size = meta.vocab_size or len(tokens.data)
    meta.has_chat_template = "tokenizer.chat_template" in reader.fields
    readers = [reader] + [GGUFReader(s) for s in shards[1:] if s.exists()]
    types: Counter[str] = Counter()
    all_types: set[str] = set()
    params = 0
    by_type: Counter[str] = Counter()
    for r in readers:
        for t in r.tensors:
            params += int(t.n_elements)
            all_types.add(t.tensor_type.name)
            # MoE experts (blk.N.ffn_*_exps) stay quantized like any other weight (gguf_weights.py).
            by_type[t.tensor_type.name] += int(t.n_elements)
            if len(t.shape) >= 2:
                types[t.tensor_type.name] += int(t.n_elements)
    meta.tensor_types = sorted(all_types)
    meta.elements_by_type = dict(by_type)
    meta.num_params = params
    meta.dtype = types.most_common(1)[0][0] if types else None
    ft = _field(reader, "general.file_type")
    meta.quantization = file_type_label(ft) if ft is not None else meta.dtype
    meta.weight_files = [s.name for s in shards if s.exists()]
    return meta


def _cache_path() -> Path:
    from wslm.paths import data_dir

    return data_dir() / "gguf-metadata.json"


def read_gguf(path: Path) -> ModelMetadata:
    """GGUF metadata, from the cache when the file has not changed since it was last read."""
    try:
        st = path.stat()
    except OSError as exc:
        return ModelMetadata(error=f"cannot read {path}: {exc}")
    key = str(path.resolve())
    stamp = [st.st_size, st.st_mtime_ns, _CACHE_VERSION]
    cache: dict = {}
    try:
        cache = json.loads(_cache_path().read_text())
        hit = cache.get(key)
        if hit and hit.get("stamp") == stamp:
            return ModelMetadata(**hit["meta"])
    except (OSError, ValueError, TypeError):
        cache = {}
    try:
        meta = _read_gguf_uncached(path)
    except Exception as exc:  # a truncated or foreign file: report it, keep listing the rest
        return ModelMetadata(error=f"not a readable GGUF file ({exc})")
    try:
        cache[key] = {"stamp": stamp, "meta": asdict(meta)}
        # Forget files that are gone so the cache does not grow forever.
        cache = {k: v for k, v in cache.items() if os.path.exists(k)}
        tmp = _cache_path().with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache))
        os.replace(tmp, _cache_path())
    except OSError as exc:
        log.debug("could not write the GGUF metadata cache: %s", exc)
    return meta
