"""Images sent in a request, read once in the front end: OpenAI `image_url` parts (data: and http(s) URLs),
Responses `input_image` parts, Anthropic `image` blocks (translated to image_url parts by their route) and
Ollama's `images` (base64). Each crossed limit is a RequestError (a 400) that names the limit and its flag."""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from wslm.backend.errors import RequestError

# PIL's names for the formats we take; a GIF gives its first frame.
FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
# Content part types that carry an image: OpenAI chat's and the Responses API's.
IMAGE_PARTS = ("image_url", "input_image")


@dataclass(slots=True)
class ImageLimits:
    """What one request may send (the server's flags; see EngineConfig)."""

    max_images: int = 8  # --limit-mm-per-prompt '{"image": N}'
    max_image_bytes: int = 20 * 2**20  # --max-image-bytes: one image, encoded (also the download cap)
    max_image_pixels: int = 16_000_000  # --max-image-pixels: width x height of one image
    fetch_timeout: float = 10.0  # --image-fetch-timeout: seconds for an http(s) image URL

    @classmethod
    def from_flags(cls, limit_mm_per_prompt: str | dict | None, max_image_bytes: int, max_image_pixels: int,
                   fetch_timeout: float) -> ImageLimits:
        limits = cls(max_image_bytes=max_image_bytes, max_image_pixels=max_image_pixels, fetch_timeout=fetch_timeout)
        if limit_mm_per_prompt:
            value = limit_mm_per_prompt
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except ValueError as exc:
                    raise ValueError(f"--limit-mm-per-prompt must be JSON such as '{{\"image\": 4}}': {exc}") from None
            if not isinstance(value, dict) or not all(isinstance(v, int) and v >= 0 for v in value.values()):
                raise ValueError("--limit-mm-per-prompt must be a JSON object of counts such as '{\"image\": 4}'.")
            unknown = sorted(set(value) - {"image"})
            if unknown:
                raise ValueError(f"--limit-mm-per-prompt: wslm takes images only, not {', '.join(unknown)}.")
            limits.max_images = value.get("image", limits.max_images)
        return limits


@dataclass(frozen=True, slots=True)
class LoadedImage:
    image: Any  # PIL.Image.Image, RGB
    content_hash: str  # sha256 of the decoded pixels (and size): the same picture in another file format is equal


def image_source(part: dict, where: str) -> str:
    """The URL (data: or http(s)) of an image_url / input_image part."""
    value = part.get("image_url")
    if isinstance(value, dict):
        value = value.get("url")
    if not isinstance(value, str) or not value:
        raise RequestError(f"{where}: an {part.get('type')} part needs a URL: "
                           '{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}} or an '
                           "http(s) URL.", param=where)
    return value


def check_count(count: int, limits: ImageLimits) -> None:
    if count > limits.max_images:
        raise RequestError(f"This request has {count} images; at most {limits.max_images} are allowed per prompt "
                           "(start the server with a larger --limit-mm-per-prompt '{\"image\": N}').",
                           param="messages", code="too_many_images")


def load_image(source: str | bytes, limits: ImageLimits, where: str) -> LoadedImage:
    """Decode one image (a data: URL, an http(s) URL, raw bytes, or bare base64 as Ollama sends it)."""
    data = _read_bytes(source, limits, where)
    _check_bytes(len(data), limits, where)
    from PIL import Image, UnidentifiedImageError

    try:
        img = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError:  # PIL's own guard, far above any sane --max-image-pixels
        raise RequestError(f"{where}: the image has more pixels than the {limits.max_image_pixels} allowed (start "
                           "the server with a larger --max-image-pixels, or scale it down).", param=where,
                           code="image_too_large") from None
    except (UnidentifiedImageError, OSError):
        raise RequestError(f"{where}: the data is not an image wslm can read; send PNG, JPEG, WebP or GIF.",
                           param=where, code="invalid_image") from None
    if img.format not in FORMATS:
        raise RequestError(f"{where}: {img.format} images are not accepted; send PNG, JPEG, WebP or GIF.",
                           param=where, code="invalid_image")
    return pil_image(img, limits, where)


def pil_image(img: Any, limits: ImageLimits, where: str) -> LoadedImage:
    """A PIL image (decoded, or given as one to LLM.generate) checked against the pixel limit, as RGB."""
    pixels = img.width * img.height
    if pixels > limits.max_image_pixels:
        raise RequestError(f"{where}: the image is {img.width}x{img.height} = {pixels} pixels; at most "
                           f"{limits.max_image_pixels} are allowed (scale it down, or start the server with a "
                           "larger --max-image-pixels).", param=where, code="image_too_large")
    try:
        img.seek(0)  # a GIF's (or animated WebP's) first frame
        rgb = img.convert("RGB")
    except (OSError, ValueError) as exc:
        raise RequestError(f"{where}: the image data is damaged ({exc}).", param=where, code="invalid_image") from None
    digest = hashlib.sha256(f"{rgb.width}x{rgb.height}:".encode())
    digest.update(rgb.tobytes())
    return LoadedImage(rgb, digest.hexdigest())


def _check_bytes(size: int, limits: ImageLimits, where: str) -> None:
    if size > limits.max_image_bytes:
        raise RequestError(f"{where}: the image is {size} bytes; at most {limits.max_image_bytes} are allowed "
                           "(send a smaller file, or start the server with a larger --max-image-bytes).",
                           param=where, code="image_too_large")


def _read_bytes(source: str | bytes, limits: ImageLimits, where: str) -> bytes:
    if isinstance(source, (bytes, bytearray)):
        return bytes(source)
    if source.startswith("data:"):
        head, sep, payload = source.partition(",")
        if not sep or ";base64" not in head:
            raise RequestError(f"{where}: a data: URL must be base64, like data:image/png;base64,....", param=where,
                               code="invalid_image")
        return _b64(payload, limits, where)
    if source.startswith(("http://", "https://")):
        return _fetch(source, limits, where)
    if "://" in source[:16]:
        raise RequestError(f"{where}: image URLs must be data: or http(s) URLs, not {source.split(':', 1)[0]}:.",
                           param=where, code="invalid_image")
    return _b64(source, limits, where)  # Ollama's images: bare base64


def _b64(payload: str, limits: ImageLimits, where: str) -> bytes:
    # Base64 is 4/3 of the bytes: refuse before decoding a huge string.
    _check_bytes(len(payload) * 3 // 4 - 2, limits, where)
    payload = "".join(payload.split())  # some clients wrap base64 in lines
    try:
        if "-" in payload or "_" in payload:
            return base64.b64decode(payload, altchars=b"-_", validate=True)  # the URL-safe alphabet
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RequestError(f"{where}: the image's base64 data is not valid ({exc}).", param=where,
                           code="invalid_image") from None


def _fetch(url: str, limits: ImageLimits, where: str) -> bytes:
    """An http(s) image, read with a timeout and never more than the byte cap."""
    request = urllib.request.Request(url, headers={"User-Agent": "wslm"})
    try:
        with urllib.request.urlopen(request, timeout=limits.fetch_timeout) as response:
            declared = response.headers.get("Content-Length")
            if declared and declared.isdigit():
                _check_bytes(int(declared), limits, where)
            data = response.read(limits.max_image_bytes + 1)
    except RequestError:
        raise
    except (TimeoutError, OSError, ValueError) as exc:  # URLError, HTTPError and socket timeouts are OSErrors
        reason = getattr(exc, "reason", None) or exc
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            raise RequestError(f"{where}: fetching {url} took longer than {limits.fetch_timeout:g} s (raise "
                               "--image-fetch-timeout, or send the image as a data: URL).", param=where,
                               code="image_fetch_failed") from None
        raise RequestError(f"{where}: the image at {url} could not be fetched: {reason}.", param=where,
                           code="image_fetch_failed") from None
    _check_bytes(len(data), limits, where)
    return data
