"""The speculative-decoding acceptance of the chat's requests: the server's /metrics counters read before
and after each request, off the GUI thread (for the developer view)."""

from __future__ import annotations

import httpx
from PySide6.QtCore import QObject, Signal

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.background import BackgroundCall
from wslm.gui.speculative import SpecCounts, spec_counts
from wslm.gui.token_count import server_root

TIMEOUT_S = 5.0


def read_counts(base_url: str, api_key: str = "") -> SpecCounts | None:
    """GET /metrics beside /v1; None when the server has no acceptance counters. Blocking."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    resp = httpx.get(server_root(base_url) + "/metrics", headers=headers, timeout=TIMEOUT_S)
    resp.raise_for_status()
    return spec_counts(resp.text)


class SpecMeter(QObject):
    """Follows the session's requests: `last` (that request's accepted/draft), `total` (since the server
    started), `available` (None: not read yet; False: the server exports no such counters)."""

    changed = Signal()

    def __init__(self, session, parent=None) -> None:
        super().__init__(parent)
        self.session = session
        self.available: bool | None = None
        self.last: SpecCounts | None = None
        self.total: SpecCounts | None = None
        self._before: SpecCounts | None = None  # the reading before the request now running
        self._url = ""
        self._no_metrics: set[str] = set()  # servers whose /metrics failed (not asked again)
        session.request_sent.connect(self._sent)
        session.request_ended.connect(self._ended)

    def _read(self, then) -> None:
        url, key = self.session.base_url, self.session.api_key
        if not url or url in self._no_metrics:
            return
        call = BackgroundCall(lambda: (url, read_counts(url, key)), self)
        call.done.connect(then)
        # A server without /metrics (another kind of server) is not asked again; a connection error may pass.
        call.failed.connect(lambda why: self._no_metrics.add(url) if why.startswith("HTTPStatusError") else None)
        call.start()

    def _sent(self, *_args) -> None:
        if self._before is None or self._url != self.session.base_url:
            self._read(self._got_before)

    def _got_before(self, result) -> None:
        url, counts = result
        self._url = url
        self._before = counts
        if counts is None:
            self._set_off()

    def _ended(self, *_args) -> None:
        self._read(self._got_after)

    def _got_after(self, result) -> None:
        url, counts = result
        if counts is None or not counts.draft:  # no counters, or all zero (a server exporting them while off)
            self._set_off()
            return
        if self._before is not None and url == self._url:
            self.last = counts - self._before
        self._url, self._before, self.total, self.available = url, counts, counts, True
        self.changed.emit()

    def _set_off(self) -> None:
        self.available, self.last, self.total, self._before = False, None, None, None
        self.changed.emit()
