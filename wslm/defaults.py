"""Defaults that the engine, `wslm serve` and the GUI share, kept in one place so they cannot drift apart.

Standard library only: the GUI imports this module, and the Windows bundle leaves out torch and
wslm.backend (tests/test_gui_app.py)."""

from __future__ import annotations

from wslm.demo import DEMO_NAME

MODEL = DEMO_NAME  # what `wslm serve` and the GUI serve when no model is named
HOST = "127.0.0.1"  # this machine only: exposing the server is a choice (docs/security.md)
PORT = 8000  # vLLM's default, so clients written for vLLM work unchanged
GPU_MEMORY_UTILIZATION = 0.9  # CUDA: share of the card the engine may use (vLLM's default)
BLOCK_SIZE = 16  # KV-cache block size in tokens
MAX_NUM_SEQS = 128  # most sequences in one batch (vLLM's --max-num-seqs); the default KV pool is sized for them
KV_CACHE_DTYPE = "auto"  # the KV cache in the model's dtype


def base_url(host: str = HOST, port: int = PORT) -> str:
    """The OpenAI-compatible base URL of a `wslm serve` at host:port."""
    return f"http://{host}:{port}/v1"
