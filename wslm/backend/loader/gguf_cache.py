"""A converted copy of each GGUF model's tokenizer and config (HF files).

Converting a GGUF vocabulary through transformers takes seconds (it took tens of seconds with gguf-py's
reader; the child now reads metadata with gguf_meta_reader.py); the copy makes every later start (a server
restart, the GUI's Restart button) read them like a plain HF folder. The weights are
not copied: they are read from the GGUF itself, tensor by tensor, and kept quantized
(wslm.backend.quant.gguf_weights), which is as fast as reading a copy. Keyed by the file's path, size and
mtime, so a replaced file is converted again. WSLM_CACHE_DIR moves it; WSLM_GGUF_CACHE=0 turns it off.

The conversion runs in a child process (convert()): transformers' GGUF reader parses the whole vocabulary
into arrays (~1.6x the demo file, twice: tokenizer and config), and in the engine's own process that peak
and the heap it leaves behind came on top of the weights (first start of the demo: peak 1.9x the file,
against 1.5x from the copy). Where the child fails, the engine converts in-process as before."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
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


def convert(gguf_path: Path) -> Path | None:
    """The converted copy's folder, made first by a child process where there is none yet; None when it
    could not be made (the caller reads the GGUF itself)."""
    folder = folder_for(gguf_path)
    if has_tokenizer_and_config(folder):
        return folder
    package_root = str(Path(__file__).resolve().parents[3])  # the folder holding wslm/
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p))
    logger.info("Converting %s's tokenizer and config (once; later starts read the copy)", gguf_path.name)
    try:
        proc = subprocess.run([sys.executable, "-m", "wslm.backend.loader.gguf_cache", str(gguf_path)],
                              env=env, capture_output=True, text=True, timeout=_CONVERT_TIMEOUT_S)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.debug("GGUF conversion in a child process failed (%s): converting in this one", exc)
        return None
    if proc.returncode != 0 or not has_tokenizer_and_config(folder):
        logger.debug("GGUF conversion in a child process failed (exit %s): %s", proc.returncode, proc.stderr[-2000:])
        return None
    return folder


# A 262k-token vocabulary takes a few minutes on a slow 2-core CPU; past this the engine converts in-process.
_CONVERT_TIMEOUT_S = 900


def _convert_here(gguf_path: Path) -> None:
    """What the child of convert() runs: read the GGUF's tokenizer and config as transformers does, and
    write the copy (the architecture named as the engine maps the GGUF's model type)."""
    import gguf
    from transformers import AutoConfig, AutoTokenizer

    from wslm.backend.loader.gguf_config import complete_config
    from wslm.backend.loader.gguf_meta_reader import GGUFMetaReader
    from wslm.backend.modeling import GGUF_ARCHITECTURES, gguf_architecture

    folder, name = str(gguf_path.parent), gguf_path.name
    # transformers opens the file with gguf.GGUFReader for the tokenizer and the config; the metadata reader
    # gives the same fields without a numpy view per vocabulary entry (gguf_meta_reader.py: 20x faster).
    # This process exists only for this conversion, so the swap touches nothing else.
    gguf.GGUFReader = GGUFMetaReader
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    hf_config = AutoConfig.from_pretrained(folder, gguf_file=name)
    complete_config(hf_config, gguf_path)
    archs = list(getattr(hf_config, "architectures", None) or [])
    model_type = getattr(hf_config, "model_type", "")
    arch = archs[0] if archs else GGUF_ARCHITECTURES.get(gguf_architecture(model_type), model_type or "unknown")
    save_tokenizer_and_config(folder_for(gguf_path), tokenizer, hf_config, arch)


if __name__ == "__main__":
    _convert_here(Path(sys.argv[1]))
