"""Model management on the Linux side: what is on disk (catalog), downloads from the Hugging Face hub or a
mirror (download), and the `wslm models` command (cli).

Downloads go into the standard HF cache layout so that the engine, transformers and huggingface_hub all
find them offline; wslm's own models folder holds models a user copies in by hand."""

from wslm.backend.hub.catalog import ModelInfo, find_model, list_models, resolve_model

__all__ = ["ModelInfo", "find_model", "list_models", "resolve_model"]
