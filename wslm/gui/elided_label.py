"""A one-line label that ends in "…" when narrower than its text, instead of widening the window."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QLabel, QSizePolicy


class ElidedLabel(QLabel):
    """Plain text only. The full text stays in text() and shows as the tooltip when cut."""

    def __init__(self, text: str = "", parent=None, objectName: str = "") -> None:
        super().__init__(text, parent, objectName=objectName)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)

    def _width(self, cap: int) -> int:
        return min(self.fontMetrics().horizontalAdvance(self.text()) + 2, cap)

    # Small hints, so the layout gives it what the widgets beside it leave (a stretch factor takes the rest),
    # but never less than about six characters: a chat's name stays recognisable ("m…" was not).
    def sizeHint(self) -> QSize:
        return QSize(self._width(160), super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:
        return QSize(self._width(self.fontMetrics().horizontalAdvance("n") * 6), super().minimumSizeHint().height())

    def paintEvent(self, _event) -> None:
        rect = self.contentsRect()
        shown = self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, rect.width())
        self.setToolTip(self.text() if shown != self.text() else "")
        p = QPainter(self)
        p.setPen(self.palette().color(self.foregroundRole()))
        p.drawText(rect, int(self.alignment() | Qt.AlignmentFlag.AlignVCenter), shown)
        p.end()

    def shown_text(self) -> str:
        """What is drawn at the current width (tests)."""
        return self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, self.contentsRect().width())
