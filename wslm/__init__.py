"""wslm: a local LLM manager for Windows users who run models inside WSL2."""

__version__ = "0.1.0"
