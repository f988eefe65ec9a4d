"""The message box under the transcript: attached files' chips, the images' thumbnails, 📎 and 🖼, the growing
text box, Send / Stop.

A view: it says what the user asked for (send_requested, stop_requested, attach_requested, image_requested,
files_dropped, image_pasted); the chat panel decides. Hooks for other parts: `attachments` (the chats'
documents), `images` (the next message's images), `text()`/`set_text()`, `set_busy()`."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QMimeData, Qt, Signal
from PySide6.QtGui import QImage, QKeyEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.attachments import Attachments
from wslm.gui.attachments_view import AttachmentBar, paperclip_icon
from wslm.gui.image_draft import ImageDraft
from wslm.gui.image_strip import ImageStrip, picture_icon


def local_files(mime: QMimeData) -> list[str]:
    """The local files a drop or paste carries ([] when it carries anything else too)."""
    if not mime.hasUrls():
        return []
    urls = mime.urls()
    return [u.toLocalFile() for u in urls] if urls and all(u.isLocalFile() for u in urls) else []


class ChatInput(QPlainTextEdit):
    """Enter sends, Shift+Enter starts a new line, Tab moves to the next control (as in a form).

    It grows with its text, from MIN_LINES up to MAX_LINES (and never past CAP_SHARE of the widget set with
    cap_to, so a small window keeps its transcript), then scrolls; it shrinks back as text goes."""

    submitted = Signal()
    files_dropped = Signal(list)  # local files pasted or dropped on the box (the panel attaches them)
    image_pasted = Signal(QImage)  # a picture pasted from the clipboard
    MIN_LINES = 2
    MAX_LINES = 10
    CAP_SHARE = 0.4

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setTabChangesFocus(True)
        self._cap_widget: QWidget | None = None
        self._fitting = False
        self.textChanged.connect(self.fit_height)
        self.fit_height()

    def cap_to(self, widget: QWidget) -> None:
        """Never take more than CAP_SHARE of `widget`'s height (refitted as it resizes)."""
        self._cap_widget = widget
        widget.installEventFilter(self)
        self.fit_height()

    def eventFilter(self, obj, event) -> bool:
        if obj is self._cap_widget and event.type() == QEvent.Type.Resize:
            self.fit_height()
        return super().eventFilter(obj, event)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():  # the text wraps anew
            self.fit_height()

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):  # other line height, margins
            self.fit_height()

    def fit_height(self) -> None:
        if self._fitting:
            return
        self._fitting = True
        try:
            line = self.fontMetrics().lineSpacing()
            margins = self.contentsMargins()  # the frame, if the style draws one
            chrome = margins.top() + margins.bottom() + 2 * int(self.document().documentMargin()) + 2
            low = self.MIN_LINES * line + chrome
            high = self.MAX_LINES * line + chrome
            if self._cap_widget is not None and self._cap_widget.height() > 0:
                high = min(high, int(self._cap_widget.height() * self.CAP_SHARE))
            high = max(high, low)
            # The laid-out height of the blocks (wrapped lines count), stopping at the cap: a long paste
            # costs no more than the lines that fit.
            text_h = 0.0
            block = self.document().firstBlock()
            while block.isValid() and chrome + text_h < high:
                text_h += self.blockBoundingRect(block).height()
                block = block.next()
            self.setFixedHeight(max(low, min(high, chrome + int(text_h + 0.999))))
        finally:
            self._fitting = False

    # A picture or files pasted or dropped here are attached, not pasted in as text (a path, nothing).
    def canInsertFromMimeData(self, source: QMimeData) -> bool:
        return source.hasImage() or bool(local_files(source)) or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:
        files = local_files(source)
        if files:
            self.files_dropped.emit(files)
        elif source.hasImage():
            self.image_pasted.emit(QImage(source.imageData()))
        else:
            super().insertFromMimeData(source)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submitted.emit()
            return
        super().keyPressEvent(event)


class Composer(QFrame):
    """The composer card. Signals: send_requested (Enter or Send), stop_requested, attach_requested (📎),
    image_requested (🖼), files_dropped (files pasted or dropped on the box), image_pasted (a picture)."""

    send_requested = Signal()
    stop_requested = Signal()
    attach_requested = Signal()
    image_requested = Signal()
    files_dropped = Signal(list)
    image_pasted = Signal(QImage)

    def __init__(self, attachments: Attachments, parent=None, images: ImageDraft | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Card")
        self.attachments = attachments  # the chats' documents: other parts attach through it
        self.images = images if images is not None else ImageDraft(self)  # the next message's images
        stack = QVBoxLayout(self)
        stack.setContentsMargins(8, 8, 8, 8)
        self.attachment_bar = AttachmentBar(attachments)
        stack.addWidget(self.attachment_bar)
        self.image_strip = ImageStrip(self.images)
        stack.addWidget(self.image_strip)
        row = QHBoxLayout()
        stack.addLayout(row)
        self.attach_button = QPushButton(paperclip_icon(), "")
        self.attach_button.setAccessibleName("Attach files")
        self.attach_button.setToolTip("Attach text, Markdown or PDF files to this chat: the model reads them "
                                      "(small files whole, larger ones the passages nearest to each message)")
        self.attach_button.setStyleSheet("QPushButton { padding: 6px 8px; }")
        self.attach_button.clicked.connect(self.attach_requested)
        self.image_button = QPushButton(picture_icon(), "", self)
        self.image_button.setAccessibleName("Attach images")
        self.image_button.setToolTip("Attach images for a model that sees them (Qwen2.5-VL, Gemma 3, SmolVLM…). "
                                     "You can also paste a picture (Ctrl+V) or drop image files on the chat.")
        self.image_button.setStyleSheet("QPushButton { padding: 6px 8px; }")
        self.image_button.clicked.connect(self.image_requested)
        attach_col = QVBoxLayout()
        attach_col.addStretch(1)
        attach_col.addWidget(self.image_button)
        attach_col.addWidget(self.attach_button)
        row.addLayout(attach_col)
        self.input = ChatInput()
        self.input.setPlaceholderText("Send a message  (Enter to send, Shift+Enter for a new line)")
        self.input.setStyleSheet("QPlainTextEdit { border: none; background: transparent; }")
        self.input.submitted.connect(self.send_requested)
        self.input.files_dropped.connect(self.files_dropped)
        self.input.image_pasted.connect(self.image_pasted)
        self.send_button = QPushButton("Send", objectName="Primary")
        self.send_button.clicked.connect(self.send_requested)
        self.stop_button = QPushButton("■  Stop")
        self.stop_button.clicked.connect(self.stop_requested)
        self.stop_button.hide()
        # Tab reaches the buttons (keyboard users), but a mouse click leaves the keyboard in the message box:
        # a clicked button that hides itself would hand focus to the next widget, where typing would land.
        for b in (self.image_button, self.attach_button, self.send_button, self.stop_button):
            b.setFocusPolicy(Qt.FocusPolicy.TabFocus)
        buttons = QVBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        row.addWidget(self.input, 1)
        row.addLayout(buttons)

    def text(self) -> str:
        return self.input.toPlainText()

    def set_text(self, text: str) -> None:
        self.input.setPlainText(text)
        self.input.setFocus()

    def clear(self) -> None:
        self.input.clear()

    def set_busy(self, busy: bool) -> None:
        """A reply is being written: Stop instead of Send (the keyboard stays in the message box)."""
        had_focus = self.send_button.hasFocus() or self.stop_button.hasFocus()
        self.send_button.setVisible(not busy)
        self.stop_button.setVisible(busy)
        if had_focus:
            (self.stop_button if busy else self.send_button).setFocus()
