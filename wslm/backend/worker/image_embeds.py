"""Image tokens' embeddings (ImageEmbedder: the model's vision encoder + projector, run once per image and kept
while its tokens are prefilled, so an image cut by chunked prefill is encoded once). Which rows of a step are
image tokens is decided where the step is prepared (engine/step_inputs.image_rows)."""

from __future__ import annotations

import logging
from collections import OrderedDict

import torch

from wslm.backend.multimodal import ImageInput

logger = logging.getLogger("wslm.engine")


def image_spans(images: list) -> list[tuple[int, int, int, int]]:
    """For a model whose image tokens see their whole image (Gemma 3): the attention spans of the images that
    end in this step (layers/image_attention.py). An image whose tokens run on into the next step (chunked
    prefill) attends causally in this step: logged once."""
    spans = []
    for row, first, last, im, seq_index in images:
        if last == im.length:
            spans.append((row, row + last - first, seq_index, im.offset + first))
        elif not _warned:
            _warned.append(True)
            logger.warning("An image's tokens were split over prefill steps: its first part attends causally, "
                           "not to the whole image (raise --max-num-batched-tokens above the image's tokens).")
    return spans


_warned: list[bool] = []


class ImageEmbedder:
    def __init__(self, model, max_images: int = 16) -> None:
        self.model = model
        self.max_images = max_images
        self._features: OrderedDict[str, torch.Tensor] = OrderedDict()

    @torch.inference_mode()
    def embeds(self, input_ids: torch.Tensor, images: list) -> torch.Tensor:
        """The step's input embeddings: the tokens' own, with image rows replaced by the image's."""
        embeds = self.model.embed(input_ids)
        for row, first, last, im, _ in images:
            embeds[row : row + last - first] = self.features(im)[first:last].to(embeds.dtype)
        return embeds

    def features(self, im: ImageInput) -> torch.Tensor:
        feats = self._features.get(im.content_hash)
        if feats is None:
            feats = self.model.embed_image(im.data)
            if feats.shape[0] != im.length:
                raise RuntimeError(f"The vision encoder gave {feats.shape[0]} embeddings for an image that has "
                                   f"{im.length} placeholder tokens (the processor and the model disagree).")
            self._features[im.content_hash] = feats
            while len(self._features) > self.max_images:
                self._features.popitem(last=False)
        else:
            self._features.move_to_end(im.content_hash)
        return feats
