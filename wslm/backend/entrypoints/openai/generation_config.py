"""--generation-config: the sampling defaults a model's creator recommends (generation_config.json), as
vLLM's default_sampling_params. They fill only the fields a request leaves unset."""

from __future__ import annotations

import json
import logging
from argparse import Namespace
from pathlib import Path
from typing import Any

log = logging.getLogger("wslm.server")

# generation_config.json name -> request field (vLLM reads the same ones).
FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


def default_sampling(args: Namespace) -> dict[str, Any]:
    """The request defaults for `wslm serve`'s flags; ValueError names a bad flag value."""
    choice = getattr(args, "generation_config", "auto") or "auto"
    if choice == "vllm":
        values: dict[str, Any] = {}
    elif choice == "auto":
        values = read_folder(_model_folder(args), required=False)
    else:
        values = read_folder(Path(choice).expanduser(), required=True)
    override = getattr(args, "override_generation_config", None)
    if override:
        try:
            extra = json.loads(override)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--override-generation-config must be a JSON object, e.g. "
                             f"'{{\"temperature\": 0.5}}' ({exc}).") from exc
        if not isinstance(extra, dict):
            raise ValueError("--override-generation-config must be a JSON object, e.g. '{\"temperature\": 0.5}'.")
        values.update(_pick(extra))
    return values


def read_folder(folder: Path | None, required: bool) -> dict[str, Any]:
    if folder is None:
        return {}
    path = folder / "generation_config.json" if folder.is_dir() or not folder.suffix else folder
    if not path.is_file():
        if required:
            raise ValueError(f"--generation-config: no generation_config.json in {folder}. Give the folder that "
                             "holds one, or `auto` (the model's) or `vllm` (no defaults).")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"--generation-config: {path} is not valid JSON ({exc}).") from exc
    return _pick(data) if isinstance(data, dict) else {}


def _pick(data: dict) -> dict[str, Any]:
    out = {}
    for name, field in FIELDS.items():
        value = data.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[field] = value
    return out


def _model_folder(args: Namespace) -> Path | None:
    from wslm.backend.loader.model_source import resolve_model

    try:
        source = resolve_model(args.model, getattr(args, "revision", None), getattr(args, "download_dir", None))
    except (FileNotFoundError, ValueError, OSError):
        return None  # the engine's load reports the real problem
    return None if source.gguf_file else source.folder
