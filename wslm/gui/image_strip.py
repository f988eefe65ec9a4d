"""Images in the chat's views: the composer's row of thumbnails (each with ✕ to remove it; hidden when there
are none), a sent message's thumbnails in its bubble, and the full image when one is clicked.

ImageStrip is a view over image_draft.ImageDraft: it rebuilds from the model and tells it what was removed."""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt, QUrl
from PySide6.QtGui import QColor, QIcon, QImage, QPainter, QPen, QPixmap, QPolygonF, QTextDocument
from PySide6.QtWidgets import QDialog, QFrame, QHBoxLayout, QLabel, QToolButton, QVBoxLayout, QWidget

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui import theme
from wslm.gui.chat_images import THUMB_SIDE
from wslm.gui.image_draft import ImageDraft, ImageRole

BUBBLE_SIDE = 96  # a thumbnail's longer side in a sent message
SHOWN_SIDE = 64  # a thumbnail's longer side in the composer


def picture_icon(color: str = theme.MUTED) -> QIcon:
    """A drawn picture (frame, sun, hill) for the attach-image button: no emoji font needed."""
    icon = QIcon()
    for size in (16, 24, 48):
        pm = QPixmap(size, size)
        pm.fill(Qt.GlobalColor.transparent)
        p = QPainter(pm)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        p.scale(size / 24, size / 24)
        p.setPen(QPen(QColor(color), 1.8, Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap, Qt.PenJoinStyle.RoundJoin))
        p.drawRoundedRect(QRectF(3, 5, 18, 14), 2, 2)
        p.drawEllipse(QPointF(8.5, 9.5), 1.6, 1.6)
        p.drawPolyline(QPolygonF([QPointF(4, 18), QPointF(10, 12), QPointF(14, 16), QPointF(16, 14), QPointF(20, 18)]))
        p.end()
        icon.addPixmap(pm)
    return icon


class ImageStrip(QWidget):
    def __init__(self, model: ImageDraft, parent=None) -> None:
        super().__init__(parent)
        self.model = model
        self.row = QHBoxLayout(self)
        self.row.setContentsMargins(0, 0, 0, 4)
        self.row.setSpacing(6)
        self.loading = QLabel("Reading image…", objectName="Muted")
        self.thumbs: list[QLabel] = []
        self.remove_buttons: list[QToolButton] = []
        for sig in (model.rowsInserted, model.rowsRemoved, model.modelReset):
            sig.connect(self.rebuild)
        model.loading_changed.connect(self.rebuild)
        self.rebuild()

    def rebuild(self, *_args) -> None:
        while self.row.count():
            item = self.row.takeAt(0)
            w = item.widget()
            if w is not None and w is not self.loading:
                w.deleteLater()
        self.thumbs, self.remove_buttons = [], []
        for r in range(self.model.rowCount()):
            idx = self.model.index(r)
            self.row.addWidget(self._tile(r, idx.data(ImageRole), idx.data(Qt.ItemDataRole.ToolTipRole)))
        self.loading.setVisible(bool(self.model.busy()))
        self.row.addWidget(self.loading)
        self.row.addStretch(1)
        self.setVisible(bool(self.model.rowCount() or self.model.busy()))

    def _tile(self, row: int, image, tip: str) -> QWidget:
        tile = QFrame()
        lay = QVBoxLayout(tile)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(0)
        pix = QPixmap()
        pix.loadFromData(image.thumb or image.data)
        if max(pix.width(), pix.height()) > SHOWN_SIDE or THUMB_SIDE < SHOWN_SIDE:
            pix = pix.scaled(SHOWN_SIDE, SHOWN_SIDE, Qt.AspectRatioMode.KeepAspectRatio,
                             Qt.TransformationMode.SmoothTransformation)
        thumb = QLabel()
        thumb.setPixmap(pix)
        thumb.setToolTip(tip)
        thumb.setAccessibleName(f"Attached image {image.name}")
        remove = QToolButton(tile)
        remove.setText("✕")
        remove.setAccessibleName(f"Remove image {image.name}")
        remove.setToolTip("Remove this image from the message")
        remove.setFocusPolicy(Qt.FocusPolicy.TabFocus)
        remove.clicked.connect(lambda _c=False, r=row: self.model.remove(r))
        head = QHBoxLayout()
        head.setContentsMargins(0, 0, 0, 0)
        head.addStretch(1)
        head.addWidget(remove)
        lay.addLayout(head)
        lay.addWidget(thumb)
        self.thumbs.append(thumb)
        self.remove_buttons.append(remove)
        return tile


class BubbleImages:
    """A user message's images as thumbnails in the transcript (a ChatView message part); each opens the full
    image. The thumbnails are decoded once and kept as the document's resources ("chatimg:ID/I", which
    survive setHtml), so re-rendering while a reply streams costs no image decoding."""

    def __init__(self, view) -> None:
        self.view = view
        self._added: set[str] = set()

    def __call__(self, row: int, msg, _streaming: bool) -> str:
        images = getattr(msg, "images", None) if msg.role == "user" else None
        if not images:
            return ""
        tiles = []
        for i, im in enumerate(images):
            name = f"chatimg:{msg.id}/{i}"
            if name not in self._added:
                self.view.document().addResource(QTextDocument.ResourceType.ImageResource, QUrl(name),
                                                 QImage.fromData(im.thumb or im.data))
                self._added.add(name)
            w, h = max(1, im.width), max(1, im.height)
            scale = min(1.0, BUBBLE_SIDE / max(w, h))
            tiles.append(f'<a href="image:{row}:{i}"><img src="{name}" width="{max(1, round(w * scale))}" '
                         f'height="{max(1, round(h * scale))}"></a>&nbsp;')
        return '<p style="margin-top:6px;">' + "".join(tiles) + "</p>"


def show_full_image(parent: QWidget, messages, arg: str) -> QDialog | None:
    """The image a thumbnail in the transcript stands for ("ROW:I"), in a window of its own."""
    try:
        row, i = (int(x) for x in arg.split(":"))
        image = messages.message(row).images[i]
    except (ValueError, AttributeError, IndexError):
        return None
    dialog = QDialog(parent)
    dialog.setWindowTitle(f"{image.name or 'Image'} ({image.width}×{image.height})")
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    pix = QPixmap()
    pix.loadFromData(image.data)
    if pix.width() > 1000 or pix.height() > 750:
        pix = pix.scaled(1000, 750, Qt.AspectRatioMode.KeepAspectRatio, Qt.TransformationMode.SmoothTransformation)
    label = QLabel()
    label.setPixmap(pix)
    QVBoxLayout(dialog).addWidget(label)
    dialog.show()
    return dialog
