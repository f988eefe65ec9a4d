"""The mouse wheel over a combo box or spin box in a scrolling form scrolls the form, as in a browser: the
value changes by wheel only once the widget has the keyboard focus (clicked or tabbed into)."""

from __future__ import annotations

from PySide6.QtCore import QCoreApplication, QEvent, QObject, Qt
from PySide6.QtWidgets import QAbstractScrollArea, QAbstractSpinBox, QComboBox, QWidget

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)


class WheelGuard(QObject):
    def eventFilter(self, obj, event) -> bool:
        if event.type() != QEvent.Type.Wheel or not isinstance(obj, QWidget) or obj.hasFocus():
            return False
        # The widget would take the turn (Qt's combo and spin boxes accept every wheel event): hand it to the
        # scroll bar of the area the form scrolls in instead.
        area = obj.parentWidget()
        while area is not None and not isinstance(area, QAbstractScrollArea):
            area = area.parentWidget()
        if area is not None:
            QCoreApplication.sendEvent(area.verticalScrollBar(), event)
        return True


def guard_wheel(root: QWidget) -> WheelGuard:
    """Guard every combo box and spin box under `root` (those added later are not). Wheel focus goes too:
    a wheel turn would otherwise give the widget the focus, and the next turn its value."""
    guard = WheelGuard(root)
    for w in root.findChildren(QWidget):
        if isinstance(w, (QComboBox, QAbstractSpinBox)):
            w.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
            w.installEventFilter(guard)
    return guard
