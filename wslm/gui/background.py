"""Run one blocking Python call (a launcher stop, a port check) on a thread; the result comes back as a signal."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, Signal, Slot

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)


class BackgroundCall(QObject):
    done = Signal(object)  # the return value
    failed = Signal(str)  # "ExceptionType: message"
    _result = Signal(object, str)

    def __init__(self, fn: Callable[[], Any], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._fn = fn
        # Emitted from the thread, received here on the GUI thread (queued: this object lives there).
        self._result.connect(self._deliver)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> BackgroundCall:
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            value, error = self._fn(), ""
        except Exception as exc:  # noqa: BLE001 - reported to the GUI as text
            value, error = None, f"{type(exc).__name__}: {exc}"
        try:
            self._result.emit(value, error)
        except RuntimeError:  # the window (and this object with it) closed meanwhile: nobody to tell
            pass

    @Slot(object, str)
    def _deliver(self, value: object, error: str) -> None:
        if error:
            self.failed.emit(error)
        else:
            self.done.emit(value)
        self.deleteLater()
