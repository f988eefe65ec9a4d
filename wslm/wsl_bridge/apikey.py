"""The API key a LAN-shared backend requires (`wslm serve --api-key KEY`).

Stored in `wslm.paths.config_dir()/api_key`, readable by the user only (mode 0600 on POSIX; on
Windows the per-user AppData folder already has a user-only ACL). Functions return the key; the CLI
prints it only when asked (`wslm share key --show`)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from wslm import paths

KEY_PREFIX = "wslm-"


def api_key_path() -> Path:
    return paths.config_dir() / "api_key"


def read_api_key() -> str | None:
    """The stored key, or None when none has been generated yet."""
    try:
        key = api_key_path().read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return key or None


def _write(key: str) -> None:
    path = api_key_path()
    tmp = path.with_name(f".api_key.{os.getpid()}.tmp")
    # Created 0600 from the start (not chmod-ed later) so the key is never readable by others.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (key + "\n").encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    try:
        os.chmod(path, 0o600)
    except OSError:
        pass


def regenerate_api_key() -> str:
    """A new random key, replacing the old one (running shared backends must restart with it)."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    _write(key)
    return key


def ensure_api_key() -> tuple[str, bool]:
    """(key, created): the stored key, generating one if there is none."""
    key = read_api_key()
    if key:
        return key, False
    return regenerate_api_key(), True
