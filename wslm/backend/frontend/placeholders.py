"""Where a processed prompt's images sit: the runs of an image placeholder token in the ids, and, for a
processor that cuts images into tiles (SmolVLM / Idefics3), one ImageInput per tile's run."""

from __future__ import annotations

from typing import Any

from wslm.backend.errors import RequestError
from wslm.backend.frontend.images import LoadedImage
from wslm.backend.multimodal import ImageInput


def tile_inputs(out: Any, runs: list[tuple[int, int]], images: list[LoadedImage]) -> tuple[ImageInput, ...]:
    """A processor that cuts each image into tiles (SmolVLM / Idefics3: pixel_values [images, tiles, 3, H, W],
    tiles of zeros padding an image with fewer): one ImageInput per tile, each its own run of placeholders in
    order, each encoded alone as transformers encodes them."""
    pixels = out["pixel_values"]
    mask = out.get("pixel_attention_mask")
    inputs = []
    for i, im in enumerate(images):
        for t in range(pixels.shape[1]):
            tile = pixels[i, t : t + 1]
            if not bool((tile != 0).any()):
                continue  # padding
            if mask is not None and not bool(mask[i, t].all()):
                raise RequestError("wslm cannot run an image tile with padded pixels yet.", param="messages")
            if len(inputs) == len(runs):
                break
            start, length = runs[len(inputs)]
            inputs.append(ImageInput(start, length, f"{im.content_hash}:{t}", {"pixel_values": tile}))
    if len(inputs) != len(runs):
        raise RequestError(f"The chat template placed {len(runs)} image placeholder runs for {len(inputs)} image "
                           "tiles: each image part must be in a message the template renders (user messages).",
                           param="messages")
    return tuple(inputs)


def placeholder_runs(ids: list[int], token: int) -> list[tuple[int, int]]:
    """(start, length) of each run of `token` in ids."""
    runs: list[tuple[int, int]] = []
    i = 0
    while i < len(ids):
        if ids[i] == token:
            j = i
            while j < len(ids) and ids[j] == token:
                j += 1
            runs.append((i, j - i))
            i = j
        else:
            i += 1
    return runs
