"""The message box under the transcript: attached files' chips, 📎, the growing text box, Send / Stop.

A view: it says what the user asked for (send_requested, stop_requested, attach_requested); the chat panel
decides. Hooks for other parts: `attachments` (the chats' documents), `text()`/`set_text()`, `set_busy()`."""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.attachments import Attachments
from wslm.gui.attachments_view import AttachmentBar, paperclip_icon


class ChatInput(QPlainTextEdit):
    """Enter sends, Shift+Enter starts a new line, Tab moves to the next control (as in a form).

    It grows with its text, from MIN_LINES up to MAX_LINES (and never past CAP_SHARE of the widget set with
    cap_to, so a small window keeps its transcript), then scrolls; it shrinks back as text goes."""

    submitted = Signal()
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

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submitted.emit()
            return
        super().keyPressEvent(event)


class Composer(QFrame):
    """The composer card. Signals: send_requested (Enter or Send), stop_requested, attach_requested (📎)."""

    send_requested = Signal()
    stop_requested = Signal()
    attach_requested = Signal()

    def __init__(self, attachments: Attachments, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("Card")
        self.attachments = attachments  # the chats' documents: other parts attach through it
        stack = QVBoxLayout(self)
        stack.setContentsMargins(8, 8, 8, 8)
        self.attachment_bar = AttachmentBar(attachments)
        stack.addWidget(self.attachment_bar)
        row = QHBoxLayout()
        stack.addLayout(row)
        self.attach_button = QPushButton(paperclip_icon(), "")
        self.attach_button.setAccessibleName("Attach files")
        self.attach_button.setToolTip("Attach text, Markdown or PDF files to this chat: the model reads them "
                                      "(small files whole, larger ones the passages nearest to each message)")
        self.attach_button.setStyleSheet("QPushButton { padding: 6px 8px; }")
        self.attach_button.clicked.connect(self.attach_requested)
        attach_col = QVBoxLayout()
        attach_col.addStretch(1)
        attach_col.addWidget(self.attach_button)
        row.addLayout(attach_col)
        self.input = ChatInput()
        self.input.setPlaceholderText("Send a message  (Enter to send, Shift+Enter for a new line)")
        self.input.setStyleSheet("QPlainTextEdit { border: none; background: transparent; }")
        self.input.submitted.connect(self.send_requested)
        self.send_button = QPushButton("Send", objectName="Primary")
        self.send_button.clicked.connect(self.send_requested)
        self.stop_button = QPushButton("■  Stop")
        self.stop_button.clicked.connect(self.stop_requested)
        self.stop_button.hide()
        # Tab reaches the buttons (keyboard users), but a mouse click leaves the keyboard in the message box:
        # a clicked button that hides itself would hand focus to the next widget, where typing would land.
        for b in (self.attach_button, self.send_button, self.stop_button):
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
