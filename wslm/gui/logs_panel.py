"""Logs panel: every line from the server and the commands the GUI ran, searchable."""

from __future__ import annotations

from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from wslm.gui.log_model import LogModel
from wslm.gui.log_view import LogView


class LogsPanel(QWidget):
    def __init__(self, logs: LogModel, parent=None) -> None:
        super().__init__(parent)
        title = QLabel("Logs", objectName="Title")
        hint = QLabel(f"Server, downloads and commands; the last {logs.max_lines:,} lines are kept.", objectName="Muted")
        hint.setWordWrap(True)
        hint.setMinimumWidth(1)
        clear = QPushButton("Clear")
        clear.clicked.connect(logs.clear)
        head = QHBoxLayout()
        head.addWidget(title)
        head.addSpacing(12)
        head.addWidget(hint, 1)
        self.source = QComboBox()
        self.source.addItem("All sources", "")
        for src, label in (("server", "Server"), ("models", "Models"), ("download", "Downloads"), ("share", "Share")):
            self.source.addItem(label, src)
        head.addWidget(self.source)
        head.addWidget(clear)
        self.view = LogView(logs)
        self.source.currentIndexChanged.connect(self._filter_source)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(18, 14, 18, 14)
        lay.addLayout(head)
        lay.addWidget(self.view, 1)

    def _filter_source(self, _index: int) -> None:
        self.view.proxy.only = self.source.currentData() or ""
        self.view.proxy.invalidateFilter()
