"""An on/off switch (a checkable button drawn with QPainter), as in LM Studio's settings."""

from __future__ import annotations

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import QAbstractButton

from wslm.gui import theme


class ToggleSwitch(QAbstractButton):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setCheckable(True)
        self.setCursor(Qt.CursorShape.PointingHandCursor)

    def sizeHint(self) -> QSize:
        return QSize(54, 30)

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        r = QRectF(1, 1, 52, 28)
        on = self.isChecked()
        track = QColor(theme.ACCENT if on else "#3a404d")
        if not self.isEnabled():
            track.setAlpha(110)
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(track)
        p.drawRoundedRect(r, 14, 14)
        p.setBrush(QColor("#ffffff" if self.isEnabled() else "#6b7280"))  # a white knob looked usable
        x = r.right() - 25 if on else r.left() + 3
        p.drawEllipse(QRectF(x, r.top() + 3, 22, 22))
