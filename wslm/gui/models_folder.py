"""The Settings dialog's models folder: handed to every `wslm` the app starts (serve, models list, pull) as
WSLM_MODELS_DIR, through WSLENV into WSL. It is a path on the backend's side (a Linux path under WSL).
Empty: the environment is left as the app found it (its own WSLM_MODELS_DIR, else ~/.wslm/models on the
backend)."""

from __future__ import annotations

import os
from collections.abc import MutableMapping

VAR = "WSLM_MODELS_DIR"
# Per environment we changed: (its WSLM_MODELS_DIR and WSLENV before our first change, the value we set).
_changed: dict[int, tuple[str | None, str | None, str]] = {}


def default_models_dir_text() -> str:
    before = _changed.get(id(os.environ))
    inherited = before[0] if before else os.environ.get(VAR)
    return inherited or "~/.wslm/models"


def _restore(env: MutableMapping[str, str], name: str, value: str | None) -> None:
    if value is None:
        env.pop(name, None)
    else:
        env[name] = value


def apply_models_dir(path: str, env: MutableMapping[str, str] | None = None) -> None:
    """Set WSLM_MODELS_DIR in `env` (default: this process's, which the app's child processes inherit) and
    list it in WSLENV so that wsl.exe passes it on; "" undoes what an earlier call set, and nothing else."""
    env = os.environ if env is None else env
    path = path.strip()
    key = id(env)
    if not path:
        if key in _changed:
            old_value, old_wslenv, ours = _changed.pop(key)
            if env.get(VAR) == ours:  # (not changed meanwhile by someone else)
                _restore(env, VAR, old_value)
                _restore(env, "WSLENV", old_wslenv)
        return
    if key not in _changed:
        _changed[key] = (env.get(VAR), env.get("WSLENV"), path)
    else:
        _changed[key] = (*_changed[key][:2], path)
    env[VAR] = path
    names = [n for n in env.get("WSLENV", "").split(":") if n and n.split("/")[0] != VAR]
    env["WSLENV"] = ":".join([*names, VAR])
