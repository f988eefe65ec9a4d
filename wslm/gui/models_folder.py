"""The Settings dialog's models folder: handed to every `wslm` the app starts (serve, models list, pull) as
WSLM_MODELS_DIR, through WSLENV into WSL. It is a path on the backend's side (a Linux path under WSL).
Empty: whatever the app was started with (WSLM_MODELS_DIR, else ~/.wslm/models on the backend)."""

from __future__ import annotations

import os
from collections.abc import MutableMapping

VAR = "WSLM_MODELS_DIR"
_INHERITED = os.environ.get(VAR)  # the app's own environment's choice, kept for an empty setting


def default_models_dir_text() -> str:
    return _INHERITED or "~/.wslm/models"


def apply_models_dir(path: str, env: MutableMapping[str, str] | None = None) -> None:
    """Set (or, for "", restore) WSLM_MODELS_DIR in `env` (default: this process's, which the app's child
    processes inherit) and list it in WSLENV so that wsl.exe passes it on."""
    env = os.environ if env is None else env
    path = path.strip()
    value = path or (_INHERITED if env is os.environ else None)
    names = [n for n in env.get("WSLENV", "").split(":") if n and n.split("/")[0] != VAR]
    if value:
        env[VAR] = value
        names.append(VAR)
    else:
        env.pop(VAR, None)
    if names:
        env["WSLENV"] = ":".join(names)
    else:
        env.pop("WSLENV", None)
