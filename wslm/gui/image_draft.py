"""The images waiting in the composer for the next message: a list model, filled off the GUI thread.

Files and pasted pictures are read, scaled and thumbnailed on a thread (chat_images); each one appears in
the model when ready, or `failed` says why it could not be attached (too large, not an image, too many)."""

from __future__ import annotations

from PySide6.QtCore import QAbstractListModel, QModelIndex, Qt, Signal
from PySide6.QtGui import QImage

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.background import BackgroundCall
from wslm.gui.chat_images import MAX_IMAGES, ImageError, image_from_qimage, load_image_file
from wslm.gui.content_parts import ChatImage

ImageRole = Qt.ItemDataRole.UserRole + 1


def _guarded(fn):
    """Run fn; an ImageError comes back as its message (a str) rather than as a failure with a type name."""
    def run():
        try:
            return fn()
        except ImageError as exc:
            return str(exc)
    return run


class ImageDraft(QAbstractListModel):
    failed = Signal(str)  # why an image was not attached (for the line under the transcript)
    loading_changed = Signal(int)  # images still being read

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self._items: list[ChatImage] = []
        self._loading = 0

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._items)

    def data(self, index: QModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        im = self._items[index.row()]
        if role == Qt.ItemDataRole.DisplayRole:
            return im.name
        if role == ImageRole:
            return im
        if role == Qt.ItemDataRole.ToolTipRole:
            return f"{im.name} ({im.width}×{im.height}, {len(im.data) / 1024:,.0f} KB)"
        return None

    def images(self) -> list[ChatImage]:
        return list(self._items)

    def busy(self) -> int:
        """How many images are still being read."""
        return self._loading

    def add_files(self, paths: list[str]) -> None:
        for path in paths:
            self._load(_guarded(lambda p=path: load_image_file(p)))

    def add_qimage(self, image, name: str = "pasted image") -> None:
        """A picture (QImage, or a QPixmap from a drop) read off the GUI thread."""
        copy = image.toImage() if hasattr(image, "toImage") else QImage(image)  # the clipboard's may change
        self._load(_guarded(lambda: image_from_qimage(copy, name)))

    def _load(self, fn) -> None:
        if len(self._items) + self._loading >= MAX_IMAGES:
            self.failed.emit(f"At most {MAX_IMAGES} images go with one message: remove one (✕) to add another.")
            return
        self._loading += 1
        self.loading_changed.emit(self._loading)
        call = BackgroundCall(fn, self)
        call.done.connect(self._loaded)
        call.failed.connect(lambda why: self._loaded(f"Could not read the image: {why}"))
        call.start()

    def _loaded(self, result) -> None:
        self._loading -= 1
        self.loading_changed.emit(self._loading)
        if isinstance(result, ChatImage):
            self.append(result)
        else:
            self.failed.emit(str(result))

    def append(self, image: ChatImage) -> None:
        row = len(self._items)
        self.beginInsertRows(QModelIndex(), row, row)
        self._items.append(image)
        self.endInsertRows()

    def remove(self, row: int) -> None:
        if 0 <= row < len(self._items):
            self.beginRemoveRows(QModelIndex(), row, row)
            del self._items[row]
            self.endRemoveRows()

    def set_images(self, images: list[ChatImage]) -> None:
        """Replace the draft's images (editing a sent message puts its images back)."""
        self.beginResetModel()
        self._items = list(images)
        self.endResetModel()

    def clear(self) -> None:
        self.set_images([])
