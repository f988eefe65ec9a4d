"""VisionPrompts: a vision model's rendered chat text and its images -> prompt ids with each image's
placeholder tokens expanded, and each image's model-ready tensors. The model's own HF processor
(AutoProcessor) does both, so the expansion (how many tokens an image takes, the markers around them) and the
pixels are exactly what transformers gives that model."""

from __future__ import annotations

import logging
from typing import Any

from wslm.backend.errors import RequestError
from wslm.backend.frontend.hf_processor import (
    load_processor,
    processor_overrides,
    split_per_image,
    token_grid,
)
from wslm.backend.frontend.images import ImageLimits, LoadedImage, check_count, load_image
from wslm.backend.frontend.placeholders import placeholder_runs, tile_inputs
from wslm.backend.multimodal import ImageInput, PromptIds

logger = logging.getLogger("wslm.engine")

# Processor outputs that describe the text, not an image.
_TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")


class VisionPrompts:
    def __init__(self, processor: Any, image_token_id: int, limits: ImageLimits, mrope: bool = False) -> None:
        self.processor = processor
        self.image_token_id = image_token_id
        self.limits = limits
        self.mrope = mrope  # the model's rotary positions follow each image's token grid (Qwen2.5-VL)

    @property
    def chat_template(self) -> str | None:
        """The processor's template (vision checkpoints often keep it there, not in the tokenizer's config)."""
        return getattr(self.processor, "chat_template", None)

    @classmethod
    def load(cls, folder: str, hf_config: Any, limits: ImageLimits, mrope: bool = False,
             overrides: dict | None = None) -> VisionPrompts:
        try:
            processor = load_processor(folder, overrides)
        except Exception as exc:  # noqa: BLE001 - any failure means the folder lacks a usable processor
            raise ValueError(f"The vision model in {folder} has no image processor transformers can load "
                             f"({type(exc).__name__}: {exc}); its processor_config.json / "
                             "preprocessor_config.json must be beside the weights.") from exc
        token_id = getattr(hf_config, "image_token_id", None)
        if token_id is None:
            token_id = getattr(hf_config, "image_token_index", None)
        if token_id is None:
            raise ValueError(f"The vision model in {folder} does not say which token is its image placeholder "
                             "(image_token_id in config.json).")
        return cls(processor, int(token_id), limits, mrope)

    def load_images(self, sources: list[tuple[str | bytes, str]]) -> list[LoadedImage]:
        """sources: (URL or bytes, the request field it came from)."""
        check_count(len(sources), self.limits)
        return [load_image(src, self.limits, where) for src, where in sources]

    def prompt(self, text: str, images: list[LoadedImage]) -> PromptIds:
        """text: the rendered prompt with one placeholder per image (the template wrote them)."""
        try:
            out = self.processor(text=[text], images=[im.image for im in images], add_special_tokens=False,
                                 return_tensors="pt")
        except ValueError as exc:  # e.g. an image too small or too oddly shaped for the processor
            raise RequestError(f"The model's image processor refused an image: {exc}", param="messages",
                               code="invalid_image") from None
        ids = out["input_ids"][0].tolist()
        runs = placeholder_runs(ids, self.image_token_id)
        if out.get("pixel_values") is not None and out["pixel_values"].dim() == 5:
            return PromptIds(ids, tile_inputs(out, runs, images))
        if len(runs) != len(images):
            raise RequestError(f"The chat template placed {len(runs)} image placeholders for {len(images)} images: "
                               "each image part must be in a message the template renders (user messages).",
                               param="messages")
        per_image = split_per_image({k: v for k, v in out.items() if k not in _TEXT_KEYS}, len(images))
        grids = [token_grid(data, self.processor, length) if self.mrope else None
                 for data, (_, length) in zip(per_image, runs)]
        return PromptIds(ids, tuple(ImageInput(start, length, im.content_hash, data, grid)
                                    for (start, length), im, data, grid in zip(runs, images, per_image, grids)))


def vision_for(source: Any, hf_config: Any, architecture: str, config: Any, tokenizer: Any = None,
               model_config: Any = None) -> Any:
    """A vision model's VisionPrompts (its processor, the server's image limits), or a GGUF's MmprojPrompts
    (its mmproj file's settings); None for a text model."""
    from wslm.backend.modeling import get_model_class
    from wslm.backend.modeling.vision import PROCESSOR_FILES, has_image_processor

    if not getattr(get_model_class(architecture), "takes_images", False):
        return None
    mmproj = getattr(model_config, "mmproj", None)
    if mmproj:
        from wslm.backend.frontend.mmproj_prompts import MmprojPrompts

        limits = ImageLimits.from_flags(config.limit_mm_per_prompt, config.max_image_bytes,
                                        config.max_image_pixels, config.image_fetch_timeout)
        return MmprojPrompts.load(mmproj, tokenizer, limits)
    if source.gguf_file:
        return None  # a vision family's text GGUF without its projector: text only
    if not has_image_processor(source.folder):
        logger.warning("%s is a vision model, but its folder has no image processor settings (%s): serving text "
                       "only", source.name, " / ".join(PROCESSOR_FILES))
        return None
    limits = ImageLimits.from_flags(config.limit_mm_per_prompt, config.max_image_bytes, config.max_image_pixels,
                                    config.image_fetch_timeout)
    vision = VisionPrompts.load(str(source.folder), hf_config, limits,
                                mrope=getattr(get_model_class(architecture), "mrope", False),
                                overrides=processor_overrides(getattr(config, "mm_processor_kwargs", None)))
    logger.info("Vision model: images in chat (at most %d per prompt, %d bytes, %d pixels each)",
                limits.max_images, limits.max_image_bytes, limits.max_image_pixels)
    return vision
