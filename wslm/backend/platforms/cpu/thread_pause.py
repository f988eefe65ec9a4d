"""Pause a Python thread from another one, at its next Python event, at no cost to it otherwise.

The background compile (decode_compiled.py) is inductor: Python holding the GIL and a core. While a lone chat
is served it should wait. A trace function set in the compile thread could look at every call, but while one
is set CPython 3.11 runs each instruction of that thread unspecialized (measured: a compile took 238 s instead
of 120 s). So nothing is set until a pause is asked for: then a C trace function (wslm/kernels/cpu_pause.c)
goes onto that thread alone (`_PyEval_SetTrace`, which CPython 3.11 and 3.12 export); at the thread's next
event it takes itself off and sleeps, the GIL released, until no pause has been asked for hold_s. Where that
cannot be had (CPython 3.13, no C compiler), hold() does nothing and the thread runs on, as before.

A thread paused while holding a lock the asker needs (the import lock, say) stops the asker, which then asks
no more: the pause ends by itself after hold_s."""

from __future__ import annotations

import ctypes
import threading

from wslm.kernels import cpu_gemv


class _State(ctypes.Structure):  # wslm_pause_state in cpu_pause.c
    _fields_ = [("held", ctypes.c_int), ("armed", ctypes.c_int), ("paused", ctypes.c_int),
                ("released", ctypes.c_int), ("period_us", ctypes.c_long), ("paused_us", ctypes.c_long)]  # fmt: skip


def _python_api():
    """(_PyEval_SetTrace, PyThreadState_Get, PyCapsule_New) of the running interpreter, or None."""
    api = ctypes.PyDLL(None)  # its own function objects; PyDLL: calls keep the GIL
    set_trace = getattr(api, "_PyEval_SetTrace", None)
    if set_trace is None:
        return None
    set_trace.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    set_trace.restype = ctypes.c_int
    api.PyThreadState_Get.restype = ctypes.c_void_p
    api.PyCapsule_New.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
    api.PyCapsule_New.restype = ctypes.py_object
    return set_trace, api.PyThreadState_Get, api.PyCapsule_New


def _trace_function() -> int | None:
    lib = cpu_gemv.library()
    if lib is None or not lib.wslm_pause_supported():
        return None
    return ctypes.cast(lib.wslm_pause_trace, ctypes.c_void_p).value


class ThreadPause:
    """Made in the thread that may be paused; hold() from any other; close() in that thread before it ends."""

    def __init__(self, hold_s: float) -> None:
        self._state = _State(period_us=max(1, int(hold_s * 1e6)))
        api, trace = _python_api(), _trace_function()
        self._set_trace = api[0] if api and trace else None
        self._trace = trace
        self._tstate = api[1]() if self._set_trace else None  # this (the pausable) thread's
        # The trace function's argument: CPython holds a reference while it is set, this object for good.
        self._capsule = api[2](ctypes.addressof(self._state), None, None) if self._set_trace else None
        self._lock = threading.Lock()  # hold() sets the trace only while the thread (its state) is there

    @property
    def supported(self) -> bool:
        return self._set_trace is not None

    @property
    def paused_s(self) -> float:
        """How long the thread has waited, in all."""
        return self._state.paused_us / 1e6

    def hold(self) -> None:
        """Pause the thread (at its next Python event) until hold() has not been called for hold_s."""
        s = self._state
        s.held = 1
        if s.paused or s.armed or s.released or self._set_trace is None:  # released: every later step
            return
        with self._lock:
            if not s.released and not s.armed and self._set_trace(self._tstate, self._trace, id(self._capsule)) == 0:
                s.armed = 1

    def close(self) -> None:
        """No more pauses; in the paused thread (its state must still be there), or to end a pause early."""
        with self._lock:
            self._state.released = 1
            if self._state.armed and self._set_trace is not None:
                self._set_trace(self._tstate, None, None)
                self._state.armed = 0
