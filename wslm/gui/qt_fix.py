"""Work around PySide6 6.12's SignalInstance.emit() returning True without a new reference.

Every emit() of a Python-defined signal then steals one reference to True; on Python < 3.12 (where
True is not immortal) the app aborts with "bool_dealloc: deallocating True or False" after enough
emits. We probe once at import and, when the bug is present, raise True's refcount far out of reach,
which is what Python 3.12+ does for it anyway (immortal objects). Import this module before emitting."""

from __future__ import annotations

import ctypes
import sys

from PySide6.QtCore import QObject, Signal

_HEADROOM = 1 << 40  # a trillion emits


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
    # ob_refcnt is the first field of every CPython object.
    ctypes.c_ssize_t.from_address(id(True)).value += _HEADROOM
    return True


APPLIED = apply()
