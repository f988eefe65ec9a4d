"""What an unfinished `wslm models pull` was fetching, so `models list` can offer to resume it.

Kept in wslm's data folder, not in the HF cache, so huggingface_hub never meets a file it does not know.

Besides the pull's command and files, "partials" maps a file name to {"etag": the hub's ETag when the
partial blobs/<etag>.incomplete was started, "validator": the strong ETag header its bytes came with}:
a resume sends the validator as If-Range, and a partial whose hub ETag has changed since is discarded."""

from __future__ import annotations

import json
import os
from pathlib import Path


def _path(repo_id: str) -> Path:
    from wslm.backend.hub.hf_cache import repo_folder_name
    from wslm.paths import data_dir

    folder = data_dir() / "pulls"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{repo_folder_name(repo_id)}.json"


def load(repo_id: str) -> dict | None:
    try:
        return json.loads(_path(repo_id).read_text())
    except (OSError, ValueError):
        return None


def save(repo_id: str, state: dict) -> None:
    path = _path(repo_id)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(state))
        os.replace(tmp, path)
    except OSError:
        pass  # best effort: losing it only hides the "resume" hint


def clear(repo_id: str) -> None:
    try:
        _path(repo_id).unlink(missing_ok=True)
    except OSError:
        pass
