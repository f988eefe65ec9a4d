"""Ask an OpenAI-compatible server which models it serves (GET /v1/models), asynchronously."""

from __future__ import annotations

import json

from PySide6.QtCore import QObject, QUrl, Signal
from PySide6.QtNetwork import QNetworkAccessManager, QNetworkReply, QNetworkRequest

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)


class ModelLister(QObject):
    listed = Signal(list)  # model ids
    failed = Signal(str)  # for the user: which URL, what went wrong, what to check

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self._net = QNetworkAccessManager(self)

    def fetch(self, base_url: str, api_key: str = "") -> None:
        req = QNetworkRequest(QUrl(base_url.rstrip("/") + "/models"))
        req.setTransferTimeout(5000)
        if api_key:
            req.setRawHeader(b"Authorization", f"Bearer {api_key}".encode())
        if not QUrl(base_url).isValid() or QUrl(base_url).scheme() not in ("http", "https"):
            self.failed.emit(f"Could not list models: “{base_url}” is not an http(s) URL. Set one like "
                             "http://host:port/v1 under Connection.")
            return
        reply = self._net.get(req)
        reply.finished.connect(lambda r=reply, u=base_url: self._done(r, u))

    def _done(self, reply: QNetworkReply, base_url: str = "") -> None:
        reply.deleteLater()
        if reply.error() != QNetworkReply.NetworkError.NoError:
            status = reply.attribute(QNetworkRequest.Attribute.HttpStatusCodeAttribute)
            fix = ("check the API key under Connection" if status in (401, 403) else
                   "check the URL (it ends in /v1) and that the server is running and reachable from here")
            self.failed.emit(f"Could not list the models at {base_url}: {reply.errorString()}. Fix: {fix}.")
            return
        try:
            data = json.loads(bytes(reply.readAll().data()))
            ids = [str(m["id"]) for m in data.get("data", [])]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self.failed.emit(f"Could not list the models at {base_url}: its /models answer is not an OpenAI-style "
                             f"model list ({exc}). Check that the URL is the API's, ending in /v1.")
            return
        self.listed.emit(ids)
