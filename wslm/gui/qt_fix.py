"""Work around PySide6 6.12's missing references to None, True and False on CPython < 3.12.

Seen with PySide6 6.12.0 on Python 3.11: SignalInstance.emit() returns True without a new reference,
and a C++ signal calling a Python slot (QPushButton.clicked) or QModelIndex.data() returning None
each drop one reference to None. After enough of them the app aborts with "bool_dealloc: deallocating
True or False" / "none_dealloc: deallocating None". Python 3.12+ makes these objects immortal, which
hides the bug. We probe once at import and, when it is present, give the three singletons a refcount
far out of reach, which is what 3.12 does anyway. Import this module before any Qt signal fires.
pyproject.toml keeps PySide6 below 6.12 (6.11.3 is clean); this stays as a guard for installs that
pick up an affected build anyway."""

from __future__ import annotations

import ctypes
import sys

from PySide6.QtCore import QObject, Signal

_HEADROOM = 1 << 40  # a trillion lost references


class _Probe(QObject):
    ping = Signal()


def _emit_steals_true() -> bool:
    probe = _Probe()
    before = sys.getrefcount(True)
    for _ in range(4):
        probe.ping.emit()
    return sys.getrefcount(True) < before - 2


def apply() -> bool:
    """Returns whether the fix was needed (and applied)."""
    if sys.version_info >= (3, 12) or sys.implementation.name != "cpython":
        return False
    if not _emit_steals_true():
        return False
    for obj in (None, True, False):
        # ob_refcnt is the first field of every CPython object.
        ctypes.c_ssize_t.from_address(id(obj)).value += _HEADROOM
    return True


APPLIED = apply()
