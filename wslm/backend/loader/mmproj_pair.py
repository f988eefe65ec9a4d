"""A text GGUF paired with llama.cpp's mmproj file: which class runs the pair, or why they do not fit.
Asked for with --mmproj, a misfit is an error naming the cause; found beside the model file (LM Studio's
layout), it is a warning and the model serves text only."""

from __future__ import annotations

import logging

logger = logging.getLogger("wslm.engine")


def pair_architecture(source, text_arch: str, hidden_size: int) -> tuple[str, str | None]:
    """(architecture to run, the mmproj path for ModelConfig.mmproj or None when it is skipped)."""
    from wslm.backend.modeling.vision.mmproj import check_pair, read_mmproj

    path = source.mmproj
    try:
        info = read_mmproj(path)
        arch = check_pair(info, text_arch, hidden_size, source.name)
    except (ValueError, FileNotFoundError) as exc:
        if not source.mmproj_auto:
            raise ValueError(f"--mmproj {path}: {exc}") from None
        logger.warning("%s is beside the model but is not its vision projector, so the model serves text only: "
                       "%s (pass --mmproj FILE to choose one)", path.name, exc)
        source.mmproj = None
        return text_arch, None
    logger.info("Vision projector %s (%s, %d image tokens per image): images in chat", path.name, info.projector,
                info.image_tokens)
    return arch, str(path)
