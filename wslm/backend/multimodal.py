"""Images in a prompt, as every layer sees them once the front end has processed them: where each image's
placeholder tokens sit in the prompt, the model-ready tensors (the HF processor's pixel values) and a hash of
the image's content (prefix caching keys the blocks that hold an image's tokens on it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class ImageInput:
    """One image of a prompt: its placeholder tokens are prompt_token_ids[offset : offset + length]; the model
    turns `data` (the processor's tensors for this image alone, e.g. {"pixel_values": [1, 3, H, W]}) into
    exactly `length` embeddings that replace those tokens' own."""

    offset: int
    length: int
    content_hash: str  # sha256 of the decoded pixels: two images with the same placeholder ids differ here
    data: dict[str, Any] = field(hash=False, compare=False)
    # The image's token grid (t, h, w) for a model whose rotary positions follow it (Qwen2.5-VL's M-RoPE,
    # mrope.py); None: its tokens take positions as text does.
    grid: tuple[int, int, int] | None = None


class PromptIds(list):
    """Prompt token ids (a list, so everything that reads prompt ids keeps working) that carry the prompt's
    images: what rendering a chat with images gives, and what InputProcessor.process accepts as a prompt."""

    images: tuple[ImageInput, ...]

    def __init__(self, ids, images: tuple[ImageInput, ...] = ()) -> None:
        super().__init__(ids)
        self.images = tuple(images)


def block_image_hashes(images: tuple[ImageInput, ...], start: int, end: int) -> tuple[str, ...]:
    """The hashes of the images whose placeholder tokens overlap token positions [start, end)."""
    return tuple(im.content_hash for im in images if im.offset < end and im.offset + im.length > start)


def whole_images(images: tuple[ImageInput, ...], start: int, num_new: int) -> int:
    """A prefill chunk [start, start + num_new) cut back to end where an image begins rather than inside it,
    so that an image's tokens are computed in one step (Gemma 3's image tokens see their whole image; vLLM's
    disable_chunked_mm_input). An image the chunk starts inside, or one larger than the chunk, is split."""
    end = start + num_new
    for im in images:
        if start < im.offset < end < im.offset + im.length:
            return im.offset - start
    return num_new


def rope_positions(images: tuple[ImageInput, ...], start: int, end: int) -> range | list[int]:
    """The rotary positions of tokens [start, end) of a sequence with these images (their 1-D part: text and
    decode tokens use it for all three M-RoPE sections; an image's tokens offset their grid from its first
    token's). The token indices, except that an image with a grid advances positions by max(h, w) rather than
    by its t * h * w tokens, so what follows it continues from its largest position + 1 (HF's
    get_rope_index); after the last image every position is index + the sequence's M-RoPE delta."""
    ends = sorted((im.offset + im.length, max(im.grid[1:]) - im.length) for im in images if im.grid is not None)
    if not ends:
        return range(start, end)
    out: list[int] = []
    shift, p = 0, start
    for im_end, delta in ends:
        if im_end <= p:
            shift += delta
            continue
        if im_end >= end:
            break
        out.extend(range(p + shift, im_end + shift))
        p, shift = im_end, shift + delta
    out.extend(range(p + shift, end + shift))
    return out
