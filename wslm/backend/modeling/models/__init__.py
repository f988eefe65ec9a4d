"""One file per model family, each a small composition of modeling/layers (registry: modeling/__init__.py)."""
