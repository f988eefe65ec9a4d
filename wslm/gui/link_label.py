"""A label whose links are reached with Tab: Tab (or Shift+Tab) into it focuses its first (last) link at
once, Enter follows it, and Tab past its last link goes on to the next control. A plain QLabel takes a
Tab stop with no link focused first, and Enter there does nothing."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)


class LinkLabel(QLabel):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.LinksAccessibleByMouse
                                     | Qt.TextInteractionFlag.LinksAccessibleByKeyboard)

    def focusInEvent(self, event) -> None:
        super().focusInEvent(event)
        if event.reason() in (Qt.FocusReason.TabFocusReason, Qt.FocusReason.BacktabFocusReason):
            QLabel.focusNextPrevChild(self, event.reason() == Qt.FocusReason.TabFocusReason)
