"""The left navigation: Chat, Models, Server, Share, Logs."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QLabel, QListWidget, QListWidgetItem, QVBoxLayout, QWidget

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm import __version__

PANELS = [("chat", "✎", "Chat"), ("models", "▦", "Models"), ("server", "▶", "Server"),
          ("share", "⇄", "Share"), ("logs", "≡", "Logs")]


class Sidebar(QWidget):
    selected = Signal(str)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("Sidebar")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self.setFixedWidth(148)  # narrow enough for a 800 px wide window (issue 24: 887 px was the minimum)
        brand = QLabel("wslm", objectName="Brand")
        self.nav = QListWidget(objectName="Nav")
        for key, icon, label in PANELS:
            item = QListWidgetItem(f"{icon}   {label}")
            item.setData(Qt.ItemDataRole.UserRole, key)
            self.nav.addItem(item)
        self.nav.currentItemChanged.connect(lambda cur, _prev: cur and self.selected.emit(cur.data(Qt.ItemDataRole.UserRole)))
        version = QLabel(f"v{__version__}", objectName="Muted")
        version.setContentsMargins(16, 0, 0, 10)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(brand)
        lay.addWidget(self.nav, 1)
        lay.addWidget(version)

    def select(self, key: str) -> None:
        for i in range(self.nav.count()):
            if self.nav.item(i).data(Qt.ItemDataRole.UserRole) == key:
                self.nav.setCurrentRow(i)
                return
