"""Load progress: how many of a model's weight bytes are in, and how fast, logged while the weights load and
handed to listeners (the server turns each report into a `{"event": "load_progress", ...}` line on stdout,
which the GUI's loading state shows).

A report goes out at the start (0%), then when REPORT_INTERVAL_S seconds or a tenth of the bytes have passed
since the last one (a slow load: a line every half second; a fast one: a line per 10%), and always once at
100%."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

logger = logging.getLogger("wslm.load")

REPORT_INTERVAL_S = 0.5
Listener = Callable[[dict], None]
_listeners: list[Listener] = []
_lock = threading.Lock()


def add_listener(listener: Listener) -> None:
    """listener(report) for every report from now on: report = {"percent", "bytes", "total_bytes",
    "mb_per_s", "elapsed_s", "model"}. Called on the loading thread; it must not raise or block."""
    with _lock:
        _listeners.append(listener)


def remove_listener(listener: Listener) -> None:
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


class LoadProgress:
    """Counts bytes in and reports (log line + listeners), throttled as the module says."""

    def __init__(self, total_bytes: int, model: str = "", clock: Callable[[], float] = time.monotonic) -> None:
        self.total = max(0, int(total_bytes))
        self.model = model
        self.clock = clock
        self.done = 0
        self.start = clock()
        self._last_time = self.start
        self._last_fraction = 0.0
        self._finished = False
        self._report(self.start, 0.0)

    def advance(self, nbytes: int) -> None:
        self.done += max(0, int(nbytes))
        now, fraction = self.clock(), self.fraction()
        if now - self._last_time >= REPORT_INTERVAL_S or fraction - self._last_fraction >= 0.1:
            self._report(now, fraction)

    def fraction(self) -> float:
        """Of the bytes expected; held below 1 until finish() (an estimated total can be passed early)."""
        if not self.total:
            return 0.0
        return min(self.done / self.total, 0.99)

    def finish(self) -> None:
        if not self._finished:
            self._finished = True
            self._report(self.clock(), 1.0)

    def _report(self, now: float, fraction: float) -> None:
        self._last_time, self._last_fraction = now, fraction
        elapsed = max(now - self.start, 1e-9)
        done = self.total if fraction >= 1.0 and self.total else self.done
        report = {
            "percent": round(100 * fraction, 1),
            "bytes": int(done),
            "total_bytes": self.total,
            "mb_per_s": round(done / elapsed / 1e6, 1),
            "elapsed_s": round(now - self.start, 2),
            "model": self.model,
        }
        logger.info("Loading weights%s: %3.0f%% (%.0f of %.0f MB, %.0f MB/s)",
                    f" of {self.model}" if self.model else "", report["percent"], done / 1e6, self.total / 1e6,
                    report["mb_per_s"])
        with _lock:
            listeners = list(_listeners)
        for listener in listeners:
            try:
                listener(report)
            except Exception:  # noqa: BLE001 - a listener (the GUI's pipe) must never stop a load
                logger.debug("a load progress listener failed", exc_info=True)


def track(items: Iterable[tuple[str, Any]], progress: LoadProgress, nbytes: Callable[[str, Any], int],
          finish: bool = True) -> Iterator[tuple[str, Any]]:
    """Yield items unchanged, counting nbytes(name, item) of each as loaded once it comes back (the consumer
    has taken it in); 100% once the stream ends, unless finish=False (one file of several)."""
    for name, item in items:
        yield name, item
        progress.advance(nbytes(name, item))
    if finish:
        progress.finish()
