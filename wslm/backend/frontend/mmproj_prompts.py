"""MmprojPrompts: images in chat for a text GGUF with llama.cpp's mmproj file, done as llama.cpp's mtmd does it.
There is no HF processor: each image part becomes the media marker "<__media__>" in the message's text (text
parts joined with newlines, as llama-server flattens content for the template), and the rendered prompt is cut
at the markers; each image takes the projector's text before and after it (Gemma 3: <start_of_image> ...
<end_of_image>; LLaVA: none) around its image tokens. Pixels come from the mmproj's own settings: the image
letterboxed to image_size (clip.cpp's padding and resampling per projector), scaled to [0, 1] and normalized
with its mean and std."""

from __future__ import annotations

from typing import Any

from wslm.backend.errors import RequestError
from wslm.backend.frontend.images import ImageLimits, LoadedImage, check_count, load_image
from wslm.backend.modeling.vision.mmproj import IMAGE_TEXT, MEDIA_MARKER, MmprojInfo, read_mmproj
from wslm.backend.multimodal import ImageInput, PromptIds

# The placeholder tokens a family's tokenizer may have (used for the image positions' ids, so prompt ids
# read as the HF checkpoint's; any id would do: the image's embeddings replace them).
_IMAGE_TOKENS = {"mlp": "<image>", "gemma3": "<image_soft_token>", "idefics3": "<image>"}


class MmprojPrompts:
    media_marker = MEDIA_MARKER
    chat_template = None  # the GGUF's own template (its tokenizer's)

    def __init__(self, info: MmprojInfo, tokenizer: Any, limits: ImageLimits) -> None:
        self.info = info
        self.tokenizer = tokenizer
        self.limits = limits
        token = tokenizer.convert_tokens_to_ids(_IMAGE_TOKENS[info.projector])
        unk = getattr(tokenizer, "unk_token_id", None)
        dedicated = isinstance(token, int) and token >= 0 and token != unk
        # image_token_id: a text prompt holding it without an image is refused (input_processor); -1: none
        self.image_token_id = token if dedicated else -1
        self.fill_id = token if dedicated else (getattr(tokenizer, "pad_token_id", None) or 0)
        before, after = IMAGE_TEXT.get(info.projector, ("", ""))
        self.before = self._encode(before)
        self.after = self._encode(after)

    @classmethod
    def load(cls, path: str, tokenizer: Any, limits: ImageLimits) -> MmprojPrompts:
        return cls(read_mmproj(path), tokenizer, limits)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []

    def load_images(self, sources: list[tuple[str | bytes, str]]) -> list[LoadedImage]:
        check_count(len(sources), self.limits)
        return [load_image(src, self.limits, where) for src, where in sources]

    def prompt(self, text: str, images: list[LoadedImage]) -> PromptIds:
        """text: the rendered prompt with one media marker per image."""
        pieces = text.split(MEDIA_MARKER)
        if len(pieces) - 1 != len(images):
            raise RequestError(f"The prompt has {len(pieces) - 1} image markers ({MEDIA_MARKER}) for {len(images)} "
                               "images: each image part must be in a message the chat template renders (user "
                               "messages); a raw prompt marks each image's place with " + MEDIA_MARKER + ".",
                               param="messages")
        if self.info.projector == "idefics3":
            return self._tiled(pieces, images)
        ids: list[int] = []
        inputs = []
        n = self.info.image_tokens
        for i, piece in enumerate(pieces):
            ids += self._encode(piece)
            if i == len(images):
                break
            ids += self.before
            inputs.append(ImageInput(len(ids), n, images[i].content_hash,
                                     {"pixel_values": pixel_values(images[i].image, self.info)}))
            ids += [self.fill_id] * n + self.after
        return PromptIds(ids, tuple(inputs))


    def _tiled(self, pieces: list[str], images: list[LoadedImage]) -> PromptIds:
        """SmolVLM / Idefics3: the image cut into tiles of image_size after a resize to the file's preproc size,
        plus the global image, by transformers' Idefics3 image processor (with the file's mean/std); each tile's
        run of <image> tokens between <fake_token_around_image> and its row/column marker, as transformers'
        processor (and mtmd's idefics3 template) writes them; each tile its own ImageInput."""
        from transformers import Idefics3ImageProcessorPil

        from wslm.backend.frontend.placeholders import placeholder_runs, tile_inputs

        if self.image_token_id < 0:
            raise RequestError("This SmolVLM GGUF's tokenizer has no <image> token: its images cannot be placed.",
                               param="messages")
        info = self.info
        processor = Idefics3ImageProcessorPil(size={"longest_edge": info.preproc_size},
                                              max_image_size={"longest_edge": info.image_size},
                                              image_mean=list(info.image_mean), image_std=list(info.image_std),
                                              do_image_splitting=True)
        out = processor([[im.image] for im in images], return_row_col_info=True, return_tensors="pt")
        text = pieces[0]
        for i, piece in enumerate(pieces[1:]):
            text += _tile_text(out["rows"][i][0], out["cols"][i][0], info.image_tokens) + piece
        ids = self._encode(text)
        return PromptIds(ids, tile_inputs(out, placeholder_runs(ids, self.image_token_id), images))


def _tile_text(rows: int, cols: int, n: int) -> str:
    """transformers' Idefics3Processor.replace_image_token."""
    fake, glob, image = "<fake_token_around_image>", "<global-img>", "<image>"
    if rows == 0 and cols == 0:
        return f"{fake}{glob}" + image * n + fake
    text = ""
    for r in range(rows):
        for c in range(cols):
            text += f"{fake}<row_{r + 1}_col_{c + 1}>" + image * n
        text += "\n"
    return text + f"\n{fake}{glob}" + image * n + fake


def pixel_values(image: Any, info: MmprojInfo):
    """[1, 3, S, S] float32: the image letterboxed to S = image_size as clip.cpp does (aspect kept, the rest
    padded: LLaVA's mean colour, black for Gemma 3), scaled to [0, 1] and normalized with the file's mean/std.
    A square image is just resized (as transformers' processors do)."""
    import numpy as np
    import torch
    from PIL import Image

    size = info.image_size
    img = image.convert("RGB")
    resample = getattr(Image.Resampling, info.resample)
    w, h = img.size
    if w == h:
        img = img.resize((size, size), resample)
    else:
        scale = min(size / w, size / h)
        nw, nh = min(size, max(1, round(w * scale))), min(size, max(1, round(h * scale)))
        canvas = Image.new("RGB", (size, size), info.pad_color)
        canvas.paste(img.resize((nw, nh), resample), ((size - nw) // 2, (size - nh) // 2))
        img = canvas
    x = np.asarray(img, dtype=np.float32) * np.float32(1 / 255)
    x = (x - np.array(info.image_mean, dtype=np.float32)) / np.array(info.image_std, dtype=np.float32)
    return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))[None]
