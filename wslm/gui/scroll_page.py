"""A panel that scrolls up and down instead of setting the window's minimum height."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import QFrame, QScrollArea, QWidget


class ScrollPage(QScrollArea):
    """Holds one panel at the page's full size when there is room, and scrolls it vertically on a small
    screen (the Server panel's form, plots and log needed ~700 px; a crash card adds more). Its width still
    counts: the panel never scrolls sideways."""

    def __init__(self, panel: QWidget, parent=None) -> None:
        super().__init__(parent)
        self.setWidget(panel)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)

    def minimumSizeHint(self) -> QSize:
        bar = self.verticalScrollBar().sizeHint().width()
        return QSize(self.widget().minimumSizeHint().width() + bar, min(200, super().minimumSizeHint().height()))
