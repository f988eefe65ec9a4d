"""One app per user and chat store: a second `wslm gui` asks the first to bring its window to the front and
exits, instead of opening a second window that says "server stopped" while the first one serves and writes
the same chat store.

The first instance listens on a QLocalServer (a Unix socket in the temp folder; a named pipe on Windows)
named after the user and the data folder (where the chat store lives): two users, or a test with its own
WSLM_CONFIG_DIR, do not meet. A second one connects, sends "raise", and reads back the first one's PID."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable

from PySide6.QtCore import QObject
from PySide6.QtNetwork import QLocalServer, QLocalSocket

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.paths import data_dir

RAISE = b"raise\n"
PING = b"ping\n"
CONNECT_TIMEOUT_MS = 1000
REPLY_TIMEOUT_MS = 3000


def instance_name() -> str:
    """The local server's name: per user and per data folder."""
    user = str(os.getuid()) if hasattr(os, "getuid") else os.environ.get("USERNAME", "")
    folder = str(data_dir().resolve())
    digest = hashlib.sha256(f"{user}\0{folder}".encode()).hexdigest()[:16]
    return f"wslm-gui-{digest}"


def ask_running_instance(name: str | None = None, ping: bool = False) -> int | None:
    """The PID of a running instance that was asked to show its window (`ping`: only asked for its PID);
    None when none answers."""
    sock = QLocalSocket()
    sock.connectToServer(name or instance_name())
    if not sock.waitForConnected(CONNECT_TIMEOUT_MS):
        return None
    sock.write(PING if ping else RAISE)
    sock.flush()
    reply = b""
    while b"\n" not in reply and sock.waitForReadyRead(REPLY_TIMEOUT_MS):
        reply += bytes(sock.readAll().data())
    sock.disconnectFromServer()
    try:
        return int(reply.split(b"\n", 1)[0].strip() or b"0") or 0
    except ValueError:
        return 0  # it answered, not with a PID: still a running instance


class InstanceServer(QObject):
    """The first instance's listener: each "raise" calls `on_raise` and answers with this process's PID."""

    def __init__(self, on_raise: Callable[[], None], name: str | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.name = name or instance_name()
        self.on_raise = on_raise
        self.server = QLocalServer(self)
        self.server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        self.server.newConnection.connect(self._on_connection)

    def listen(self) -> bool:
        """Listen (False: could not, which the app survives: it runs as before, unguarded). A socket file
        left by an instance that crashed is removed first, but only when nobody answers on it."""
        if self.server.listen(self.name):
            return True
        if ask_running_instance(self.name, ping=True) is not None:
            return False  # another instance started at the same moment and won
        QLocalServer.removeServer(self.name)
        return self.server.listen(self.name)

    def _on_connection(self) -> None:
        while self.server.hasPendingConnections():
            sock = self.server.nextPendingConnection()
            sock.readyRead.connect(lambda s=sock: self._on_read(s))
            sock.disconnected.connect(sock.deleteLater)

    def _on_read(self, sock: QLocalSocket) -> None:
        data = bytes(sock.readAll().data())
        if RAISE.strip() in data or PING.strip() in data:
            sock.write(f"{os.getpid()}\n".encode())
            sock.flush()
        if RAISE.strip() in data:
            try:
                self.on_raise()
            except Exception as exc:  # noqa: BLE001 - a failed raise must not take the app down
                if sys.stderr is not None:
                    print(f"wslm gui: could not show the window: {exc}", file=sys.stderr)

    def close(self) -> None:
        self.server.close()
