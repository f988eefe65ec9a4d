"""`wslm models list / rm` on the target, as asynchronous calls that fill the Models table."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.cli_process import JsonProcess
from wslm.gui.crash_hints import likely_cause
from wslm.gui.log_model import LogModel
from wslm.gui.models_model import ModelsTableModel
from wslm.wsl_bridge.launcher import Target


class ModelsService(QObject):
    listed = Signal(list)  # model ids
    failed = Signal(str)  # what went wrong, with the fix
    removed = Signal(str)

    def __init__(self, logs: LogModel, parent=None) -> None:
        super().__init__(parent)
        self.logs = logs
        self.target = Target.local()
        self.table = ModelsTableModel(self)
        self._list_proc: JsonProcess | None = None
        self.loading = False
        self.context = 0  # the Server panel's context length: estimates for the server it would start

    def refresh(self) -> None:
        if self._list_proc and self._list_proc.running:
            return
        proc = JsonProcess(self)
        got: list[dict] = []
        proc.event.connect(lambda e: got.append(e))
        proc.log_line.connect(lambda line: self.logs.add("models", line))
        proc.finished.connect(lambda code, tail: self._listed(code, tail, got))
        self._list_proc = proc
        self.loading = True
        args = ["models", "list", "--json"] + (["--context", str(int(self.context))] if self.context else [])
        argv = self.target.wslm_argv(args)
        self.logs.add("models", "$ " + " ".join(argv))
        proc.start(argv)

    def shutdown(self) -> None:
        """App exit: a listing still running is stopped and its result dropped (the chat store it would
        refresh is being closed)."""
        proc, self._list_proc = self._list_proc, None
        if proc is not None:
            proc.finished.disconnect()
            if proc.running:
                proc.kill()
                proc.wait(2000)
        self.loading = False

    def _listed(self, code: int, tail: str, events: list[dict]) -> None:
        self.loading = False
        self._list_proc = None
        payload = next((e for e in events if isinstance(e.get("models"), list)), None)
        if code != 0 or payload is None:
            err = next((e.get("message") for e in events if e.get("event") == "error"), "") or tail.strip()
            why = (f"`wslm models list` failed on {self.target.describe()} (exit {code}): "
                   f"{err[-300:] or 'no output'}. {likely_cause(code, tail.splitlines(), err)}")
            self.logs.add("models", f"failed: {why}")  # the Logs panel says why, not only the command
            self.failed.emit(why)
            return
        self.table.set_models(payload["models"])
        self.listed.emit(self.table.ids())

    def remove(self, model_id: str) -> None:
        proc = JsonProcess(self)
        proc.log_line.connect(lambda line: self.logs.add("models", line))
        proc.finished.connect(lambda code, tail: self._removed(model_id, code, tail))
        argv = self.target.wslm_argv(["models", "rm", model_id, "--yes"])
        self.logs.add("models", "$ " + " ".join(argv))
        proc.start(argv)

    def _removed(self, model_id: str, code: int, tail: str) -> None:
        if code != 0:
            why = f"Could not delete {model_id} (exit {code}): {tail.strip()[-400:]}"
            self.logs.add("models", f"failed: {why}")
            self.failed.emit(why)
        else:
            self.removed.emit(model_id)
        self.refresh()
