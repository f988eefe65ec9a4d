"""Ask an OpenAI-compatible server which models it serves (GET /v1/models), asynchronously."""

from __future__ import annotations

import json

from PySide6.QtCore import QObject, QUrl, Signal
from PySide6.QtNetwork import QNetworkAccessManager, QNetworkReply, QNetworkRequest

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)


class ModelLister(QObject):
    listed = Signal(list)  # model ids
    failed = Signal(str)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self._net = QNetworkAccessManager(self)

    def fetch(self, base_url: str, api_key: str = "") -> None:
        req = QNetworkRequest(QUrl(base_url.rstrip("/") + "/models"))
        req.setTransferTimeout(5000)
        if api_key:
            req.setRawHeader(b"Authorization", f"Bearer {api_key}".encode())
        reply = self._net.get(req)
        reply.finished.connect(lambda r=reply: self._done(r))

    def _done(self, reply: QNetworkReply) -> None:
        reply.deleteLater()
        if reply.error() != QNetworkReply.NetworkError.NoError:
            self.failed.emit(reply.errorString())
            return
        try:
            data = json.loads(bytes(reply.readAll().data()))
            ids = [str(m["id"]) for m in data.get("data", [])]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self.failed.emit(f"unexpected /models answer: {exc}")
            return
        self.listed.emit(ids)
