"""LAN sharing through wslm.wsl_bridge.share, on background threads (netsh and UAC prompts block).

Also watches the WSL IP: a status poll that finds stale rules runs a refresh by itself."""

from __future__ import annotations

from PySide6.QtCore import QObject, QTimer, Signal

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm import defaults
from wslm.gui.background import BackgroundCall

POLL_MS = 15000


NOT_WINDOWS = ("LAN sharing is set up from Windows: it adds the port forwarding and firewall rules a WSL distro "
               "needs. This app is running on Linux, where there is nothing to set up here.")


def _error_text(exc_text: str) -> str:
    """The bridge's error in the app's words: no exception class names, no command-line advice."""
    kind, _, message = exc_text.partition(": ")
    if kind == "NotWindowsError":
        return NOT_WINDOWS
    if kind.endswith("Error") and " " not in kind:
        # "fix:" lines address the CLI user ("run this command from Windows ..."); keep the message.
        return message.split("\n  fix:", 1)[0].strip()
    return exc_text


class ShareService(QObject):
    status_changed = Signal(dict)  # ShareStatus.to_dict()
    result = Signal(dict)  # {"action", "messages", "server" (with the key), "restart_required", ...}
    failed = Signal(str, str)  # action, message with fix
    busy_changed = Signal(bool)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.port = defaults.PORT
        self.distro: str | None = None
        self.status: dict = {}
        self.busy = False
        self._timer = QTimer(self, interval=POLL_MS)
        self._timer.timeout.connect(self._watch_tick)

    def start_watching(self) -> None:
        self._timer.start()

    def stop_watching(self) -> None:
        self._timer.stop()

    def _run(self, action: str, fn) -> None:
        if self.busy:
            return
        self.busy = True
        self.busy_changed.emit(True)
        call = BackgroundCall(fn, self)
        call.done.connect(lambda value: self._done(action, value))
        call.failed.connect(lambda err: self._failed(action, err))
        call.start()

    def _done(self, action: str, value) -> None:
        self.busy = False
        self.busy_changed.emit(False)
        if action == "status":
            self.status = value.to_dict()
            self.status_changed.emit(self.status)
            if self.status.get("enabled") and self.status.get("stale"):
                self.refresh()  # the WSL IP changed: re-point the rules
            return
        data = value.to_dict(show_key=True)
        if value.status is not None:
            self.status = value.status.to_dict()
            self.status_changed.emit(self.status)
        self.result.emit(data)

    def _failed(self, action: str, err: str) -> None:
        self.busy = False
        self.busy_changed.emit(False)
        self.failed.emit(action, _error_text(err))

    def _watch_tick(self) -> None:
        # The watch exists to re-point an active share after the WSL IP changes. Asking WSL for its
        # status starts a stopped distro, so with nothing shared the timer leaves WSL alone (the panel
        # and the user's Refresh still poll on demand).
        if self.status.get("enabled"):
            self.poll()

    def poll(self) -> None:
        from wslm.wsl_bridge import share

        self._run("status", lambda: share.share_status(self.port, self.distro))

    def turn_on(self) -> None:
        from wslm.wsl_bridge import share

        self._run("on", lambda: share.share_on(self.port, self.distro))

    def turn_off(self) -> None:
        from wslm.wsl_bridge import share

        self._run("off", lambda: share.share_off(self.port))

    def refresh(self) -> None:
        from wslm.wsl_bridge import share

        self._run("refresh", lambda: share.share_refresh(self.port, self.distro))

    @staticmethod
    def api_key() -> str:
        """The shared key, "" before the first `share on` makes one."""
        from wslm.wsl_bridge import apikey

        return apikey.read_api_key() or ""

    @staticmethod
    def regenerate_key() -> str:
        from wslm.wsl_bridge import apikey

        return apikey.regenerate_api_key()
