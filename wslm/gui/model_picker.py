"""The chat's model picker rows, as LM Studio shows them: the name, then parameters · quant · size · context
in a muted line, and a "loaded" badge on each model the server has loaded now (with a model pool, more than
one), "loading" on one it is loading. A last row browses for a .gguf."""

from __future__ import annotations

from PySide6.QtCore import QRect, QSize, Qt
from PySide6.QtGui import QColor, QFont, QPainter
from PySide6.QtWidgets import QStyle, QStyledItemDelegate, QStyleOptionViewItem

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui import theme

DetailsRole = Qt.ItemDataRole.UserRole + 11  # "1.5B · Q4_K_M · 940.0 MiB · 32,768 ctx"
LoadedRole = Qt.ItemDataRole.UserRole + 12  # the server has this model loaded now
LoadingRole = Qt.ItemDataRole.UserRole + 13  # the server is loading it (its model pool, on the user's pick)
BROWSE = "\x00browse"  # the "Browse…" row's item data (no model id looks like it)
BROWSE_TEXT = "Browse for a .gguf file…"


class ModelPickerDelegate(QStyledItemDelegate):
    """Two lines a model (name; details), a green "loaded" pill on the right of each loaded one (an amber
    "loading" one while it loads)."""

    PAD = 6

    def sizeHint(self, option: QStyleOptionViewItem, index) -> QSize:
        base = super().sizeHint(option, index)
        lines = 2 if index.data(DetailsRole) else 1
        return QSize(base.width() + 70, option.fontMetrics.height() * lines + 2 * self.PAD + (2 if lines > 1 else 0))

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index) -> None:
        painter.save()
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        if selected:
            painter.fillRect(option.rect, QColor(theme.ACCENT).darker(170))
        rect = option.rect.adjusted(8, self.PAD, -8, -self.PAD)
        fm = option.fontMetrics
        name = str(index.data(Qt.ItemDataRole.DisplayRole) or "")
        details = str(index.data(DetailsRole) or "")
        badge_w = 0
        pill = ("loaded", theme.OK) if index.data(LoadedRole) else ("loading", theme.WARN) \
            if index.data(LoadingRole) else None
        if pill is not None:
            word, color = pill
            bold = QFont(option.font)
            bold.setPointSizeF(max(6.0, option.font.pointSizeF() * 0.85))
            bold.setBold(True)
            painter.setFont(bold)
            text_w = painter.fontMetrics().horizontalAdvance(word)
            badge = QRect(rect.right() - text_w - 12, rect.top() + 1, text_w + 12, fm.height() - 2)
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(QColor(color).darker(250))
            painter.drawRoundedRect(badge, 7, 7)
            painter.setPen(QColor(color))
            painter.drawText(badge, Qt.AlignmentFlag.AlignCenter, word)
            badge_w = badge.width() + 8
        painter.setFont(option.font)
        browse = index.data(Qt.ItemDataRole.UserRole) == BROWSE
        painter.setPen(QColor(theme.ACCENT if browse else theme.TEXT))
        line = QRect(rect.left(), rect.top(), rect.width() - badge_w, fm.height())
        painter.drawText(line, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                         fm.elidedText(name, Qt.TextElideMode.ElideMiddle, line.width()))
        if details:
            painter.setPen(QColor(theme.MUTED))
            line2 = QRect(rect.left(), rect.top() + fm.height() + 2, rect.width(), fm.height())
            painter.drawText(line2, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                             fm.elidedText(details, Qt.TextElideMode.ElideRight, line2.width()))
        painter.restore()
