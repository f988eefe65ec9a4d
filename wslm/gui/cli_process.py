"""Run one `wslm ... --json` command with QProcess and turn its stdout JSON lines into signals.

Never blocks: QProcess reports output through the event loop. Non-JSON stdout lines and all of stderr
come out as log lines, so nothing the command says is lost."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import deque

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, Signal

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)


class JsonProcess(QObject):
    event = Signal(dict)  # one JSON object from stdout
    log_line = Signal(str)  # stderr, or stdout that is not JSON
    finished = Signal(int, str)  # exit code (-N: killed by signal N, -1: could not start), last lines

    def __init__(self, parent: QObject | None = None, keep_lines: int = 40) -> None:
        super().__init__(parent)
        self._proc: QProcess | None = None
        self._out = b""
        self._err = b""
        self._tail: deque[str] = deque(maxlen=keep_lines)
        self._done = False
        # Set on the GUI thread when the process has ended; safe to read from any thread.
        self.exited = threading.Event()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.state() != QProcess.ProcessState.NotRunning

    def tail(self) -> list[str]:
        return list(self._tail)

    def start(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        """`env`: the child's whole environment (default: inherit ours)."""
        self._out, self._err, self._done = b"", b"", False
        self.exited.clear()
        self._tail.clear()
        proc = QProcess(self)
        if env is not None:
            qenv = QProcessEnvironment()
            for key, value in env.items():
                qenv.insert(key, value)
            proc.setProcessEnvironment(qenv)
        proc.readyReadStandardOutput.connect(self._read_out)
        proc.readyReadStandardError.connect(self._read_err)
        proc.finished.connect(self._on_finished)
        proc.errorOccurred.connect(self._on_error)
        self._proc = proc
        if sys.platform == "win32" and hasattr(proc, "setNativeArguments"):
            # Quote exactly as the launcher's own subprocess calls do (wsl.exe re-joins its arguments).
            proc.setProgram(argv[0])
            proc.setNativeArguments(subprocess.list2cmdline(argv[1:]))
            proc.start()
        else:
            proc.start(argv[0], argv[1:])

    def terminate(self) -> None:
        """SIGTERM: `wslm` commands treat it like Ctrl+C (pull exits 130, resumable)."""
        if self.running:
            self._proc.terminate()

    def kill(self) -> None:
        if self.running:
            self._proc.kill()

    def pid(self) -> int:
        return int(self._proc.processId()) if self._proc else 0

    def wait(self, msecs: int) -> bool:
        """Only for shutdown paths (app exit, tests)."""
        return self._proc.waitForFinished(msecs) if self._proc else True

    def _read_out(self) -> None:
        self._out += bytes(self._proc.readAllStandardOutput().data())
        *lines, self._out = self._out.split(b"\n")
        for raw in lines:
            self._emit_stdout(raw)

    def _emit_stdout(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        if not text.strip():
            return
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            self.event.emit(obj)
        else:
            self._tail.append(text)
            self.log_line.emit(text)

    def _read_err(self) -> None:
        self._err += bytes(self._proc.readAllStandardError().data())
        *lines, self._err = self._err.split(b"\n")
        for raw in lines:
            # Progress bars redraw with \r: keep what the line finally showed.
            text = raw.decode("utf-8", "replace").rstrip("\r").rsplit("\r", 1)[-1]
            self._tail.append(text)
            self.log_line.emit(text)

    def _flush(self) -> None:
        if self._proc is None:
            return
        self._read_out()
        self._read_err()
        if self._out:
            self._emit_stdout(self._out)
            self._out = b""
        if self._err:
            text = self._err.decode("utf-8", "replace")
            self._tail.append(text)
            self.log_line.emit(text)
            self._err = b""

    def _on_finished(self, code: int, status: QProcess.ExitStatus) -> None:
        if self._done:
            return
        self._done = True
        self.exited.set()
        self._flush()
        if status == QProcess.ExitStatus.CrashExit:
            # On POSIX Qt gives the signal's number as the code: say -9 (as subprocess does), not "exit 9".
            code = -code if code > 0 and sys.platform != "win32" else code or -1
        self.finished.emit(int(code), "\n".join(self._tail))

    def _on_error(self, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart and not self._done:
            self._done = True
            self.exited.set()
            program = self._proc.program()
            msg = f"Could not start {program}: {self._proc.errorString()}"
            self._tail.append(msg)
            self.log_line.emit(msg)
            self.finished.emit(-1, "\n".join(self._tail))
