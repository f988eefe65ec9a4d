"""The line above the transcript: the chat's title, the model picker (with ⏏), the context meter, where the
chat goes (a dot and a few words) and ⚙ (the settings column)."""

from __future__ import annotations

import html

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QWidget

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.elided_label import ElidedLabel
from wslm.gui.model_picker import ModelPicker


def short_count(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


class ChipLabel(QLabel):
    """A coloured dot and a few words ("● loading…"); cut with "…" when the header has no room (at the
    smallest window), never setting its minimum width. text() keeps the whole (rich) text."""

    MIN_WIDTH = 44
    color = "#8d96a8"
    words = ""

    def set_chip(self, color: str, words: str) -> None:
        self.color, self.words = color, words
        self.setText(f"<span style='color:{color};'>●</span> {html.escape(words)}")

    def sizeHint(self) -> QSize:
        return QSize(self.fontMetrics().horizontalAdvance(f"● {self.words}") + 4, super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:
        return QSize(min(self.sizeHint().width(), self.MIN_WIDTH), super().minimumSizeHint().height())

    def paintEvent(self, _event) -> None:
        rect, fm = self.contentsRect(), self.fontMetrics()
        p = QPainter(self)
        align = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
        p.setPen(QColor(self.color))
        p.drawText(rect, align, "●")
        x = fm.horizontalAdvance("● ")
        p.setPen(self.palette().color(self.foregroundRole()))
        p.drawText(rect.adjusted(x, 0, 0, 0), align,
                   fm.elidedText(self.words, Qt.TextElideMode.ElideRight, max(0, rect.width() - x)))
        p.end()


class ChatHeader(QWidget):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        head = QHBoxLayout(self)
        head.setContentsMargins(0, 0, 0, 0)
        self.title = ElidedLabel("New chat", objectName="Title")  # a long title gives way to the picker
        self.connection_label = ChipLabel(objectName="Muted")
        self.settings_button = QPushButton("⚙")
        self.settings_button.setCheckable(True)
        self.settings_button.setAccessibleName("Chat settings")
        self.settings_button.setToolTip("Show or hide the chat settings (system prompt, sampling, connection)")
        self.settings_button.setStyleSheet("QPushButton { padding: 6px 8px; }")  # one glyph: no wide padding
        self.picker = ModelPicker()
        # Tokens the next request would hold / the model's context (estimated; the server's count when known).
        self.context_meter = QLabel(objectName="Muted")
        head.addWidget(self.title, 1)
        head.addWidget(self.picker, 2)
        head.addWidget(self.context_meter)
        head.addWidget(self.connection_label)
        head.addWidget(self.settings_button)

    def set_connection(self, color: str, text: str, tooltip: str = "") -> None:
        """The dot and a few words beside the picker, whole where there is room, cut with "…" where there is
        not (a custom URL, the smallest window; whole in the tooltip)."""
        self.connection_label.set_chip(color, text)
        self.connection_label.setToolTip(tooltip or text)

    def set_context(self, used: int, window: int | None, parts: str) -> None:
        """The meter: ≈used / window (amber from 80 %, red when over); hidden while nothing would be sent.
        `parts`: what the count holds, for the tooltip."""
        meter = self.context_meter
        meter.setVisible(bool(used))  # an empty chat: no meter, and no gap in the header
        if not used:
            return
        color = ""
        if window:
            meter.setText(f"≈{short_count(used)} / {short_count(window)}")
            color = "#f85149" if used >= window else "#d29922" if used >= 0.8 * window else ""
        else:
            meter.setText(f"≈{short_count(used)} tokens")
        meter.setStyleSheet(f"color: {color};" if color else "")
        meter.setToolTip(f"About {used:,} tokens of {window:,} in the model's context (estimated: {parts})"
                         if window else f"About {used:,} tokens so far ({parts}; the model's context size is "
                         "not known)")
