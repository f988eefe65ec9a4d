"""The app's log: every line from the server and the commands the GUI runs, capped, searchable."""

from __future__ import annotations

import re
import time
from collections import deque

from PySide6.QtCore import QAbstractListModel, QModelIndex, QSortFilterProxyModel, Qt

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)

SourceRole = Qt.ItemDataRole.UserRole + 1
MAX_LINES = 5000
# A time the line brings itself (uvicorn's and the engine's logging): the view shows ours, once.
_OWN_TIMESTAMP = re.compile(r"^\[?(\d{4}-\d\d-\d\d[ T])?\d\d:\d\d:\d\d([.,]\d+)?\]?\s+")


def strip_timestamp(line: str) -> str:
    return _OWN_TIMESTAMP.sub("", line, count=1)


class LogModel(QAbstractListModel):
    def __init__(self, max_lines: int = MAX_LINES, parent=None) -> None:
        super().__init__(parent)
        self.max_lines = max_lines
        self._lines: deque[tuple[float, str, str]] = deque()
        self.added = 0  # lines ever added: a mark for since() that survives the cap dropping old lines

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._lines)

    def data(self, index: QModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        ts, source, text = self._lines[index.row()]
        if role == Qt.ItemDataRole.DisplayRole:
            return f"{time.strftime('%H:%M:%S', time.localtime(ts))}  [{source}]  {text}"
        if role == SourceRole:
            return source
        return None

    def add(self, source: str, text: str) -> None:
        for line in text.splitlines() or [""]:
            if len(self._lines) >= self.max_lines:
                self.beginRemoveRows(QModelIndex(), 0, 0)
                self._lines.popleft()
                self.endRemoveRows()
            row = len(self._lines)
            self.beginInsertRows(QModelIndex(), row, row)
            self._lines.append((time.time(), source, strip_timestamp(line)))
            self.added += 1
            self.endInsertRows()

    def tail(self, source: str, n: int = 20) -> list[str]:
        out = [text for _, src, text in reversed(self._lines) if src == source][:n]
        return list(reversed(out))

    def since(self, mark: int, source: str, n: int = 20) -> list[str]:
        """The last `n` lines of `source` added after `mark` (a value of `added`): one run's lines only."""
        new = min(len(self._lines), self.added - mark)
        lines = list(self._lines)[len(self._lines) - new:] if new > 0 else []
        return [text for _, src, text in lines if src == source][-n:]

    def clear(self) -> None:
        self.beginResetModel()
        self._lines.clear()
        self.endResetModel()

    def text(self) -> str:
        return "\n".join(self.data(self.index(i)) for i in range(len(self._lines)))


class LogFilter(QSortFilterProxyModel):
    """Case-insensitive search, optionally only one source (the server panel shows only the server)."""

    def __init__(self, source: LogModel, only: str = "", parent=None) -> None:
        super().__init__(parent)
        self.only = only
        self.setSourceModel(source)
        self.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)

    def filterAcceptsRow(self, row: int, parent: QModelIndex) -> bool:
        if self.only:
            idx = self.sourceModel().index(row, 0, parent)
            if self.sourceModel().data(idx, SourceRole) != self.only:
                return False
        return super().filterAcceptsRow(row, parent)
