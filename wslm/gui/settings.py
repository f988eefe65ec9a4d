"""The GUI's settings: one JSON file in wslm.paths.config_dir() (WSLM_CONFIG_DIR overrides).

Plain data, no Qt, so tests and the CLI can read it. Unknown keys are kept so that a newer version's
settings survive a round trip through an older one; a corrupt file is moved aside, never overwritten."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from wslm import defaults
from wslm.paths import config_dir

log = logging.getLogger(__name__)

SETTINGS_FILE = "gui.json"


@dataclass
class Settings:
    # Where the backend runs: {"kind": "local"} or {"kind": "wsl", "distro": "Ubuntu"};
    # {} until chosen: WSL's default distro on Windows, else this machine.
    target: dict = field(default_factory=dict)
    first_run_done: bool = False
    # Server panel (names follow `wslm serve` / vLLM flags).
    model: str = defaults.MODEL
    host: str = defaults.HOST
    port: int = defaults.PORT
    max_model_len: int = 0  # 0: the model's own context length
    gpu_memory_utilization: float = defaults.GPU_MEMORY_UTILIZATION
    api_key: str = ""
    auto_restart: bool = False
    start_server_on_launch: bool = False  # start the server with the Server panel's settings when the app opens
    quantization: str = ""  # --quantization ("": the model's own)
    kv_cache_dtype: str = defaults.KV_CACHE_DTYPE  # --kv-cache-dtype
    tensor_parallel_size: int = 1  # --tensor-parallel-size (offered with several GPUs)
    serve_extra_args: str = ""  # more `wslm serve` flags, shell-quoted
    # --model-pool all: the chat's picker loads another installed model beside the running one (no restart).
    model_pool: bool = True
    # Speculative decoding (--speculative-config): off, or prompt lookup ("" draft) or an installed draft model's id.
    speculative_decoding: bool = False
    speculative_draft: str = ""
    # Chat: against our server, or any OpenAI-compatible URL.
    chat_use_server: bool = True
    chat_base_url: str = defaults.base_url()
    chat_api_key: str = ""
    chat_model: str = ""
    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int = 1024
    system_prompt: str = "You are a helpful assistant."
    chat_settings_visible: bool = True  # the chat's right-hand settings column
    chat_context_overflow: str = "drop_oldest"  # a chat longer than the context: drop_oldest | truncate_middle | stop
    # Documents attached to chats: where passages are embedded ("": the chat's own server and model), files
    # small enough to go in whole, passages per message, a passage's size.
    rag_embed_base_url: str = ""
    rag_embed_api_key: str = ""
    rag_embed_model: str = ""
    rag_whole_file_tokens: int = 2000
    rag_top_k: int = 4
    rag_chunk_chars: int = 1000
    # Models.
    hub_endpoint: str = ""
    models_dir: str = ""  # WSLM_MODELS_DIR for the backend ("": its default); the Settings dialog sets it
    # Window.
    theme: str = "dark"  # "dark" | "light" (wslm.gui.theme.THEMES)
    window_geometry: str = ""  # QWidget.saveGeometry() as base64
    last_panel: str = "chat"
    extra: dict = field(default_factory=dict)  # keys this version does not know

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        extra = data.pop("extra")
        return {**extra, **data}


def settings_path() -> Path:
    return config_dir() / SETTINGS_FILE


def load_settings(path: Path | None = None) -> Settings:
    """Read the settings; a missing file gives defaults, a corrupt one is kept as gui.json.bad."""
    path = path or settings_path()
    if not path.exists():
        return Settings()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        backup = path.with_suffix(path.suffix + ".bad")
        log.warning("Settings file %s is unreadable (%s); kept as %s, using defaults", path, exc, backup)
        try:
            os.replace(path, backup)
        except OSError:
            pass
        return Settings()
    known = {f.name for f in fields(Settings)} - {"extra"}
    defaults = Settings()
    kwargs: dict[str, Any] = {}
    for name in known:
        if name in data:
            value = data[name]
            default = getattr(defaults, name)
            # A hand-edited file with a wrong type must not crash the app: fall back per key.
            if isinstance(default, bool) != isinstance(value, bool) or not isinstance(value, type(default)):
                if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
                    value = float(value)
                else:
                    log.warning("Settings key %r has a wrong type; using the default", name)
                    continue
            kwargs[name] = value
    kwargs["extra"] = {k: v for k, v in data.items() if k not in known}
    return Settings(**kwargs)


def save_settings(settings: Settings, path: Path | None = None) -> None:
    """Write atomically (temp file + rename) so a crash mid-write cannot lose the old settings."""
    path = path or settings_path()
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(settings.to_json(), indent=2, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)
