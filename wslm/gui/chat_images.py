"""Reading an image for the chat (a file, a pasted QImage): checked, scaled down, encoded, thumbnailed.

Blocking (decoding a large photo takes a while): call it off the GUI thread (image_draft does). QImage is
safe to use on any thread; QPixmap is not, so nothing here makes one."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt
from PySide6.QtGui import QImage, QImageReader

from wslm.gui.content_parts import ChatImage

MAX_FILE_BYTES = 20 * 1024 * 1024  # a bigger file is refused before it is read
MAX_SIDE = 2048  # longer sides are scaled down: vision towers resize to far less, and the request stays small
MAX_SEND_BYTES = 5 * 1024 * 1024  # an encoded image is never sent larger than this
MAX_IMAGES = 8  # per message
THUMB_SIDE = 96
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")
IMAGE_FILTER = "Images (" + " ".join(f"*{s}" for s in IMAGE_SUFFIXES) + ")"


class ImageError(ValueError):
    """An image that cannot be attached; the message says why and what to do."""


def is_image_path(path: str) -> bool:
    return Path(path).suffix.lower() in IMAGE_SUFFIXES


def _encode(image: QImage, fmt: str, quality: int = -1) -> bytes:
    data = QByteArray()
    buf = QBuffer(data)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buf, fmt, quality)
    buf.close()
    return bytes(data)


def load_image_file(path: str | Path) -> ChatImage:
    """Read an image file for a message; ImageError when it is too large or not an image."""
    p = Path(path)
    name = p.name
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise ImageError(f"Cannot read {name}: {exc.strerror or exc}.") from exc
    if size > MAX_FILE_BYTES:
        raise ImageError(f"{name} is too large ({size / 2**20:.1f} MB; images up to "
                         f"{MAX_FILE_BYTES // 2**20} MB can be attached). Save a smaller copy and attach that.")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ImageError(f"Cannot read {name}: {exc.strerror or exc}.") from exc
    image = QImage.fromData(raw)
    if image.isNull():
        raise ImageError(f"{name} is not an image this app can read (PNG, JPEG, WebP, GIF or BMP).")
    fmt = bytes(QImageReader.imageFormat(str(p)).data()).decode().lower() or p.suffix.lower().lstrip(".")
    return _finish(image, name, raw if fmt in ("png", "jpeg", "jpg") else b"", fmt)


def image_from_qimage(image: QImage, name: str = "pasted image") -> ChatImage:
    """A pasted or dropped picture (no file): encoded as PNG, or JPEG when that would be too large."""
    if image.isNull():
        raise ImageError("The clipboard holds no image that can be read.")
    return _finish(image, name, b"", "")


def _finish(image: QImage, name: str, raw: bytes, fmt: str) -> ChatImage:
    """Scale down past MAX_SIDE; keep a PNG/JPEG file's own bytes when they fit, else re-encode."""
    w, h = image.width(), image.height()
    if max(w, h) > MAX_SIDE:
        image = image.scaled(MAX_SIDE, MAX_SIDE, Qt.AspectRatioMode.KeepAspectRatio,
                             Qt.TransformationMode.SmoothTransformation)
        raw = b""
    if raw and len(raw) <= MAX_SEND_BYTES:
        mime, data = ("image/png", raw) if fmt == "png" else ("image/jpeg", raw)
    else:
        mime, data = "image/png", _encode(image, "PNG")
        if len(data) > MAX_SEND_BYTES and not image.hasAlphaChannel():
            mime, data = "image/jpeg", _encode(image, "JPEG", 90)  # a photo: PNG of it is several times larger
        if len(data) > MAX_SEND_BYTES:
            raise ImageError(f"{name} is still {len(data) / 2**20:.1f} MB after scaling to {MAX_SIDE} px (at most "
                             f"{MAX_SEND_BYTES // 2**20} MB is sent). Save it as a JPEG and attach that.")
    thumb = image.scaled(THUMB_SIDE, THUMB_SIDE, Qt.AspectRatioMode.KeepAspectRatio,
                         Qt.TransformationMode.SmoothTransformation)
    return ChatImage(mime=mime, data=data, name=name, thumb=_encode(thumb, "PNG"),
                     width=image.width(), height=image.height())
