"""One `wslm models pull REPO --json` run: its events become a progress state; cancel and resume.

Cancel sends SIGTERM (the command exits 130 and keeps partial files); resume runs the same command
again, which continues where it stopped."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Signal

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.cli_process import JsonProcess
from wslm.gui.log_model import LogModel
from wslm.wsl_bridge.launcher import Target

IDLE, RUNNING, DONE, CANCELLED, FAILED = "idle", "running", "done", "cancelled", "failed"

_MIRROR_FLAG = re.compile(r"(a mirror)(?::| with) --endpoint URL(?: or HF_ENDPOINT=URL)?")


def app_wording(message: str) -> str:
    """`wslm models pull`'s advice in the app's terms: the Mirror endpoint field, not its CLI flag."""
    return _MIRROR_FLAG.sub(r"\1: fill in “Mirror endpoint” in the Download dialog (e.g. https://hf-mirror.com)",
                            message)


@dataclass
class PullProgress:
    state: str = IDLE
    file: str = ""
    file_bytes: int = 0
    file_total: int = 0
    bytes: int = 0
    total_bytes: int = 0
    speed_bps: float = 0.0
    eta_s: float | None = None
    files_done: list[str] = field(default_factory=list)
    message: str = ""

    @property
    def fraction(self) -> float:
        return self.bytes / self.total_bytes if self.total_bytes else 0.0

    @property
    def file_fraction(self) -> float:
        return self.file_bytes / self.file_total if self.file_total else 0.0


class PullJob(QObject):
    changed = Signal()
    finished = Signal(str)  # final state

    def __init__(self, target: Target, repo: str, file_pattern: str = "", endpoint: str = "",
                 logs: LogModel | None = None, parent=None) -> None:
        super().__init__(parent)
        self.target = target
        self.repo = repo.strip()
        self.file_pattern = file_pattern.strip()
        self.endpoint = endpoint.strip()
        self.logs = logs
        self.progress = PullProgress()
        self._proc: JsonProcess | None = None
        self._final: tuple[str, str] | None = None

    def argv(self) -> list[str]:
        args = ["models", "pull", self.repo]
        if self.file_pattern:
            args += ["--file", self.file_pattern]
        if self.endpoint:
            args += ["--endpoint", self.endpoint]
        return self.target.wslm_argv([*args, "--json"])

    @property
    def running(self) -> bool:
        return self.progress.state == RUNNING

    def start(self) -> None:
        """Start, or resume after a cancel or failure."""
        if self.running:
            return
        before = self.progress
        again = "Retrying…" if before.state == FAILED else "Resuming…" if before.state == CANCELLED else "Starting…"
        # Keep the byte counts of the earlier run: a resume continues from them.
        self.progress = PullProgress(state=RUNNING, files_done=before.files_done, message=again,
                                     bytes=before.bytes, total_bytes=before.total_bytes)
        proc = JsonProcess(self)
        proc.event.connect(self._on_event)
        proc.log_line.connect(self._on_log)
        proc.finished.connect(lambda code, tail, pr=proc: self._on_finished(pr, code, tail))
        self._proc = proc
        self._final: tuple[str, str] | None = None
        self.changed.emit()
        argv = self.argv()
        if self.logs:
            self.logs.add("download", "$ " + " ".join(argv))
        proc.start(argv)

    def cancel(self) -> None:
        if self._proc and self.running:
            self.progress.message = "Cancelling…"
            self.changed.emit()
            self._proc.terminate()

    def _on_log(self, line: str) -> None:
        if self.logs:
            self.logs.add("download", line)

    def _on_event(self, e: dict) -> None:
        p = self.progress
        kind = e.get("event")
        if kind == "start":
            p.total_bytes = int(e.get("total_bytes") or p.total_bytes)
            p.message = f"Downloading {self.repo}"
        elif kind == "progress":
            p.file = str(e.get("file", p.file))
            p.file_bytes = int(e.get("file_bytes") or 0)
            p.file_total = int(e.get("file_total") or 0)
            p.bytes = int(e.get("bytes") or 0)
            p.total_bytes = int(e.get("total_bytes") or p.total_bytes)
            p.speed_bps = float(e.get("speed_bps") or 0.0)
            p.eta_s = e.get("eta_s")
            p.message = ""
        elif kind == "file_done":
            name = str(e.get("file", ""))
            if name and name not in p.files_done:
                p.files_done.append(name)
        # Final events take effect when the process has exited, so Resume never overlaps the old run.
        elif kind == "done":
            p.bytes = p.total_bytes or p.bytes
            self._final = (DONE, "Download complete")
        elif kind == "error":
            err = e.get("message") or (e.get("error") or {}).get("message") or "download failed"
            self._final = (FAILED, app_wording(str(err)))
        elif kind == "cancelled":
            self._final = (CANCELLED, "Cancelled; Resume continues where it stopped")
        self.changed.emit()

    def _on_finished(self, proc: JsonProcess, code: int, tail: str) -> None:
        if proc is not self._proc:
            return
        p = self.progress
        if self._final:
            p.state, p.message = self._final
        else:  # no final event: decide from the exit code
            if code == 0:
                p.state, p.message = DONE, "Download complete"
            elif code == 130:
                p.state, p.message = CANCELLED, "Cancelled; Resume continues where it stopped"
            else:
                p.state = FAILED
                p.message = f"The download stopped (exit code {code}): {tail.strip()[-300:] or 'no output'}"
        if p.state == FAILED and self.logs:
            self.logs.add("download", f"failed: {p.message}")  # the Logs panel says why, not only the command
        self.changed.emit()
        self.finished.emit(p.state)
