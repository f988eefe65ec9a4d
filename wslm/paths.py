"""Where wslm keeps its files: config (WSLM_CONFIG_DIR overrides) and models (WSLM_MODELS_DIR)."""

from __future__ import annotations

from pathlib import Path

from wslm import envs


def config_dir() -> Path:
    """The per-user config folder, created on first use."""
    env = envs.WSLM_CONFIG_DIR
    if env:
        path = env
    else:
        import platformdirs

        path = Path(platformdirs.user_config_dir("wslm", appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def data_dir() -> Path:
    """The per-user data folder (databases, logs), created on first use."""
    env = envs.WSLM_DATA_DIR
    if env:
        path = env
    elif envs.is_set("WSLM_CONFIG_DIR"):
        # Tests move the config dir; keep data beside it so nothing leaks into the real home.
        path = config_dir() / "data"
    else:
        import platformdirs

        path = Path(platformdirs.user_data_dir("wslm", appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir() -> Path:
    """wslm's own models folder (WSLM_MODELS_DIR overrides; under WSLM_CONFIG_DIR when that is set); kept on
    the Linux disk for fast loads."""
    env = envs.WSLM_MODELS_DIR
    if env:
        path = env
    elif envs.is_set("WSLM_CONFIG_DIR"):
        # Like data_dir(): a moved config dir (tests, portable set-ups) takes the models folder with it.
        path = config_dir() / "models"
    else:
        path = Path.home() / ".wslm" / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path
