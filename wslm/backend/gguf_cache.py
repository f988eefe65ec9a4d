"""A converted copy of each GGUF model: tokenizer, config and dequantized weights as safetensors.

Dequantizing a GGUF and parsing its vocabulary takes tens of seconds on a small CPU; the copy makes every
later start (a server restart, the GUI's Restart button) load like a plain HF folder. Keyed by the file's
path, size and mtime, so a replaced file is converted again. WSLM_CACHE_DIR moves it;
WSLM_GGUF_CACHE=0 turns it off; weights above WSLM_GGUF_CACHE_MAX_GB (default 8) are not copied."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import torch

logger = logging.getLogger(__name__)


def cache_root() -> Path:
    env = os.environ.get("WSLM_CACHE_DIR")
    if env:
        return Path(env).expanduser() / "gguf"
    import platformdirs

    return Path(platformdirs.user_cache_dir("wslm", appauthor=False)) / "gguf"


def enabled() -> bool:
    return os.environ.get("WSLM_GGUF_CACHE", "1") not in ("0", "false", "no")


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


def weights_file(folder: Path, dtype: torch.dtype) -> Path:
    return folder / f"model-{str(dtype).removeprefix('torch.')}.safetensors"


def max_weights_bytes() -> int:
    """Above this size the dequantized copy costs more disk than the start-up time it saves."""
    return int(float(os.environ.get("WSLM_GGUF_CACHE_MAX_GB", "8")) * 2**30)


def save_weights(path: Path, state: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    total = sum(t.numel() * t.element_size() for t in state.values())
    if total > max_weights_bytes():
        logger.info(
            "Not caching the dequantized weights (%.1f GiB > WSLM_GGUF_CACHE_MAX_GB); each start dequantizes again.",
            total / 2**30,
        )
        return

    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Tied embeddings share storage with lm_head; safetensors refuses shared tensors, and the engine
        # re-ties them anyway.
        seen: set[int] = set()
        unique = {}
        for name, tensor in state.items():
            ptr = tensor.untyped_storage().data_ptr()
            if ptr in seen:
                continue
            seen.add(ptr)
            unique[name] = tensor.contiguous()
        save_file(unique, str(tmp))
        os.replace(tmp, path)
    except Exception as exc:
        logger.warning("Could not cache the dequantized weights in %s: %s", path, exc)
        tmp.unlink(missing_ok=True)
