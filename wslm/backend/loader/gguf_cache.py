"""A converted copy of each GGUF model's tokenizer and config (HF files).

Parsing a GGUF vocabulary through transformers takes tens of seconds on a small CPU; the copy makes every
later start (a server restart, the GUI's Restart button) read them like a plain HF folder. The weights are
not copied: they are read from the GGUF itself, tensor by tensor, and kept quantized
(wslm.backend.quant.gguf_weights), which is as fast as reading a copy. Keyed by the file's path, size and
mtime, so a replaced file is converted again. WSLM_CACHE_DIR moves it; WSLM_GGUF_CACHE=0 turns it off."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from wslm import envs

logger = logging.getLogger(__name__)


def cache_root() -> Path:
    env = envs.WSLM_CACHE_DIR
    if env:
        return env / "gguf"
    import platformdirs

    return Path(platformdirs.user_cache_dir("wslm", appauthor=False)) / "gguf"


def enabled() -> bool:
    return envs.WSLM_GGUF_CACHE


def folder_for(gguf_path: Path) -> Path:
    st = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_root() / f"{gguf_path.stem}-{key}"


def has_tokenizer_and_config(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "tokenizer_config.json").is_file()


def save_tokenizer_and_config(folder: Path, tokenizer, hf_config, architecture: str) -> None:
    """Best effort: a failure to write the cache must never stop the model from loading."""
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(tmp)
        hf_config.architectures = [architecture]
        hf_config.save_pretrained(tmp)
        data = json.loads((tmp / "config.json").read_text())
        data.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(data, indent=2))
        folder.mkdir(parents=True, exist_ok=True)
        for item in tmp.iterdir():
            os.replace(item, folder / item.name)
    except Exception as exc:
        logger.warning("Could not write the GGUF cache in %s: %s", folder, exc)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
