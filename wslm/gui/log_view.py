"""A searchable, auto-scrolling view over the log model (used by the Server and Logs panels)."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QFont, QGuiApplication
from PySide6.QtWidgets import QHBoxLayout, QLineEdit, QListView, QPushButton, QVBoxLayout, QWidget

from wslm.gui.log_model import LogFilter, LogModel


class LogView(QWidget):
    def __init__(self, logs: LogModel, only: str = "", parent=None) -> None:
        super().__init__(parent)
        self.logs = logs
        self.proxy = LogFilter(logs, only, self)
        self.search = QLineEdit(placeholderText="Search the log")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self.proxy.setFilterFixedString)
        copy = QPushButton("Copy")
        copy.clicked.connect(self.copy_visible)
        bar = QHBoxLayout()
        bar.addWidget(self.search, 1)
        bar.addWidget(copy)
        self.list = QListView()
        self.list.setModel(self.proxy)
        # Long lines (tracebacks, paths) wrap rather than end in "…"; batched layout keeps thousands of
        # rows of different heights fast.
        self.list.setWordWrap(True)
        self.list.setTextElideMode(Qt.TextElideMode.ElideNone)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setResizeMode(QListView.ResizeMode.Adjust)
        self.list.setLayoutMode(QListView.LayoutMode.Batched)
        self.list.setBatchSize(200)
        mono = QFont()
        mono.setFamilies(["Cascadia Mono", "Consolas", "DejaVu Sans Mono", "Noto Sans Mono CJK SC", "monospace"])
        mono.setPointSizeF(9)
        self.list.setFont(mono)
        self.list.setStyleSheet("QListView::item { padding: 1px 6px; }")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(bar)
        lay.addWidget(self.list, 1)
        # Follow new lines while the view is at the bottom. Whether it is, is decided by the user's own
        # scrolling only: the range grows in batches after the rows arrive (and not at all while the panel is
        # hidden), so comparing value and maximum on insert lost the bottom after a burst of lines.
        self.following = True
        self._kept = 0  # the position the user scrolled to, while not following
        bar = self.list.verticalScrollBar()
        bar.actionTriggered.connect(lambda _a: QTimer.singleShot(0, self._on_user_scrolled))
        bar.sliderReleased.connect(self._on_user_scrolled)
        bar.rangeChanged.connect(self._follow)
        self.proxy.rowsInserted.connect(self._follow)
        self.proxy.modelReset.connect(self._follow)

    def _on_user_scrolled(self) -> None:
        bar = self.list.verticalScrollBar()
        self.following = bar.value() >= bar.maximum() - max(1, bar.singleStep())
        self._kept = bar.value()

    def _follow(self, *_args) -> None:
        if self.following:
            self.list.scrollToBottom()
        elif self._kept <= self.list.verticalScrollBar().maximum():
            # Reading further up: a new line re-lays the list out in batches, which shrinks the range for a
            # moment and clamps the position; put it back where the user left it.
            self.list.verticalScrollBar().setValue(self._kept)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        QTimer.singleShot(0, self._follow)  # lines that came while another panel was shown

    def copy_visible(self) -> None:
        lines = [self.proxy.index(i, 0).data() for i in range(self.proxy.rowCount())]
        QGuiApplication.clipboard().setText("\n".join(lines))
