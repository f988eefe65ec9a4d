"""Where a model's files are: the demo model, a HF folder, a .gguf file, a repo id in the HF cache, or a
`wslm models` id. Pure path logic; reading the files is model_loader's job."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from wslm.backend.modeling.vision.mmproj import find_mmproj, is_mmproj_name


@dataclass(slots=True)
class ModelSource:
    name: str  # what the user asked for
    folder: Path  # a folder with config.json + weights, or the folder holding the gguf file
    gguf_file: str | None = None
    # A GGUF's vision projector (llama.cpp's mmproj GGUF); mmproj_auto: found beside the file, not asked for
    # (a projector that does not fit the model is then skipped with a warning instead of an error).
    mmproj: Path | None = None
    mmproj_auto: bool = False

    @property
    def gguf_path(self) -> Path | None:
        return self.folder / self.gguf_file if self.gguf_file else None

    def converted(self) -> Path | None:
        """The GGUF's converted copy (tokenizer + config), if one is ready."""
        from wslm.backend.loader import gguf_cache

        if not self.gguf_file or not gguf_cache.enabled():
            return None
        folder = gguf_cache.folder_for(self.gguf_path)
        return folder if gguf_cache.has_tokenizer_and_config(folder) else None


def resolve_model(model: str, revision: str | None = None, download_dir: str | None = None) -> ModelSource:
    """Turn what the user typed into files on disk, or raise FileNotFoundError saying what to do. A repo id
    is looked up in the HF cache (download_dir when given) at `revision` (branch, tag or commit)."""
    from wslm.demo import demo_model_path, is_demo
    from wslm.embed_model import EMBED_NAME, embed_model_path, is_embed_model

    if is_demo(model):
        path = demo_model_path()
        return ModelSource("demo", path.parent, path.name)
    if is_embed_model(model) and not Path(model).expanduser().exists():
        return ModelSource(EMBED_NAME, embed_model_path())
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _gguf_source(model, path)
    if path.is_dir():
        if (path / "config.json").is_file():
            return ModelSource(model, path)
        ggufs = sorted(p for p in path.glob("*.gguf") if not is_mmproj_name(p.name))
        if len(ggufs) == 1:
            return _gguf_source(model, ggufs[0])
        raise FileNotFoundError(
            f"{path} is neither a Hugging Face model folder (no config.json) nor a folder with one .gguf file."
        )
    if path.exists():
        raise FileNotFoundError(f"{path} is not a model: give a model folder or a .gguf file.")
    if model.startswith(("/", "./", "../", "~")) or "\\" in model:
        raise FileNotFoundError(f"No such model file or folder: {path}. Check the path, or list models with `wslm models list`.")
    # A name as `wslm models list` shows it: a GGUF copied into the models folder is listed as
    # "folder/file.gguf", which is no path from here but is a model's name.
    found = _resolve_by_name(model, revision, download_dir)
    if found is not None:
        return resolve_model(str(found))
    if model.endswith(".gguf"):
        raise FileNotFoundError(f"No such model file: {path}, and no model of that name in `wslm models list`. "
                                "Check the path or the name.")
    where = f"in {download_dir} (--download-dir)" if download_dir else "in the local Hugging Face cache"
    at = f" at revision {revision!r}" if revision else ""
    raise FileNotFoundError(
        f"Model {model!r}{at} was not found: not a path, not in `wslm models list`, not {where}. "
        f"Download it with `wslm models pull {model}`, or pass a model folder or .gguf file."
    )


def _gguf_source(name: str, path: Path) -> ModelSource:
    if is_mmproj_name(path.name):
        raise FileNotFoundError(f"{path.name} is a vision projector (mmproj), not a model: pass the model's GGUF, "
                                f"with --mmproj {path}.")
    mmproj = find_mmproj(path)
    return ModelSource(name, path.parent, path.name, mmproj=mmproj, mmproj_auto=mmproj is not None)


def with_mmproj(source: ModelSource, mmproj: str | None) -> ModelSource:
    """The source with --mmproj's file (replacing one found beside the model); "none": no projector, not even
    one beside the model (llama.cpp's --no-mmproj)."""
    if not mmproj:
        return source
    if mmproj.strip().lower() == "none":
        source.mmproj, source.mmproj_auto = None, False
        return source
    path = Path(mmproj).expanduser()
    if not source.gguf_file:
        raise ValueError(f"--mmproj goes with a GGUF model file; {source.name} is a Hugging Face folder, whose "
                         "vision tower (if any) is in its own weights.")
    if not path.is_file():
        raise FileNotFoundError(f"No such mmproj file: {path} (--mmproj).")
    source.mmproj, source.mmproj_auto = path, False
    return source


def _resolve_by_name(name: str, revision: str | None = None, download_dir: str | None = None) -> Path | None:
    try:
        from wslm.backend.hub.catalog import resolve_model as catalog_resolve
    except ImportError:
        catalog_resolve = None
    if catalog_resolve is not None and revision is None and download_dir is None:
        found = catalog_resolve(name)
        if found is not None:
            return Path(found)
    if name.count("/") == 1:
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(name, revision=revision, cache_dir=download_dir, local_files_only=True))
        except Exception:  # not in the cache: the caller raises the user-facing error
            return None
    return None
