"""A small live line plot (sparkline) drawn with QPainter: title, current value, filled history."""

from __future__ import annotations

from collections import deque

from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget


class Sparkline(QWidget):
    def __init__(self, title: str, unit: str = "%", max_value: float | None = 100.0,
                 color: str = "#4f9dff", points: int = 60, parent=None) -> None:
        super().__init__(parent)
        self.title = title
        self.unit = unit
        self.max_value = max_value  # None: scale to the largest value seen
        self.color = QColor(color)
        self.values: deque[float] = deque(maxlen=points)
        self.caption = ""  # e.g. "3.1 / 16 GiB"
        self.note = ""  # shown instead of a plot when there is no data source
        self.setMinimumSize(120, 86)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:
        return QSize(220, 92)

    def add(self, value: float | None, caption: str = "") -> None:
        if value is None:
            return
        self.values.append(float(value))
        self.caption = caption
        self.note = ""
        self.update()

    def set_note(self, text: str) -> None:
        self.note = text
        self.update()

    def clear(self) -> None:
        self.values.clear()
        self.caption = ""
        self.update()

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        r = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        p.setPen(QPen(QColor("#2c313c"), 1))
        p.setBrush(QColor("#1b1e25"))
        p.drawRoundedRect(r, 8, 8)

        font = QFont(self.font())
        font.setPointSizeF(max(7.5, font.pointSizeF() * 0.9))
        p.setFont(font)
        p.setPen(QColor("#9aa3b5"))
        p.drawText(r.adjusted(10, 6, -10, 0), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop, self.title)
        current = self.values[-1] if self.values else None
        value_text = "—" if current is None else f"{current:.0f}{self.unit}" if current >= 10 else f"{current:.1f}{self.unit}"
        bold = QFont(font)
        bold.setBold(True)
        p.setFont(bold)
        p.setPen(QColor("#e8ebf1"))
        p.drawText(r.adjusted(10, 6, -10, 0), Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignTop, value_text)
        p.setFont(font)
        plot = r.adjusted(10, 26, -10, -18 if self.caption else -8)
        if self.caption:
            p.setPen(QColor("#7d8699"))
            p.drawText(r.adjusted(10, 0, -10, -4), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignBottom, self.caption)
        if self.note or not self.values:
            p.setPen(QColor("#6b7385"))
            p.drawText(plot, Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap, self.note or "waiting for data")
            return
        top = self.max_value if self.max_value else max(max(self.values), 1e-9) * 1.15
        n = self.values.maxlen or len(self.values)
        step = plot.width() / max(n - 1, 1)
        x0 = plot.right() - step * (len(self.values) - 1)
        pts = [QPointF(x0 + i * step, plot.bottom() - min(v / top, 1.0) * plot.height())
               for i, v in enumerate(self.values)]
        p.setPen(QPen(QColor("#262a33"), 1, Qt.PenStyle.DashLine))
        for frac in (0.5,):
            y = plot.bottom() - frac * plot.height()
            p.drawLine(QPointF(plot.left(), y), QPointF(plot.right(), y))
        path = QPainterPath(QPointF(pts[0].x(), plot.bottom()))
        for pt in pts:
            path.lineTo(pt)
        path.lineTo(QPointF(pts[-1].x(), plot.bottom()))
        fill = QColor(self.color)
        fill.setAlpha(60)
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(fill)
        p.drawPath(path)
        p.setPen(QPen(self.color, 1.8))
        p.setBrush(Qt.BrushStyle.NoBrush)
        for a, b in zip(pts, pts[1:], strict=False):
            p.drawLine(a, b)
