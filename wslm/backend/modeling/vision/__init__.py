"""Vision towers (image encoders) of vision-language families, plain tensors like the text models."""

from pathlib import Path

# Where a checkpoint keeps its image processor's settings (transformers 5 / 4.x).
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


def has_image_processor(folder: str | Path) -> bool:
    """A vision checkpoint without its processor's settings can serve text only (no way to make pixels)."""
    folder = Path(folder)
    return folder.is_dir() and any((folder / name).is_file() for name in PROCESSOR_FILES)
