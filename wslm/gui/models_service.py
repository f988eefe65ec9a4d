"""`wslm models list / rm` on the target, as asynchronous calls that fill the Models table."""

from __future__ import annotations

import re
import shlex

from PySide6.QtCore import QObject, Signal

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.cli_process import JsonProcess
from wslm.gui.crash_hints import likely_cause
from wslm.gui.log_model import LogModel
from wslm.gui.models_model import ModelsTableModel
from wslm.wsl_bridge.launcher import Target

# What `wslm serve` reads as a size (kv_sizing.parse_bytes; the GUI bundle has no wslm.backend to import it).
_SIZE = re.compile(r"\s*[0-9]*\.?[0-9]+\s*[kmgt]?(i?b)?\s*", re.IGNORECASE)
_KV_FLAGS = {"--kv-cache-dtype": "--kv-cache-dtype", "--kv-cache-memory": "--kv-cache-memory",
             "--kv-cache-memory-bytes": "--kv-cache-memory",
             "--max-num-seqs": "--max-num-seqs"}  # serve's flag (and vLLM's alias) -> ours


def kv_estimate_args(kv_cache_dtype: str, extra_args: str | list[str], draft_model: str = "") -> list[str]:
    """The `models list` flags that size the KV cache as the Server panel's server will: its KV dtype and a
    --kv-cache-memory / --kv-cache-dtype / --max-num-seqs among its extra flags (given later on serve's
    command line, they win), and its speculative draft model (its weights and keys beside each model). A value
    serve would refuse is left out: the listing must not fail for it (the start says why)."""
    if isinstance(extra_args, str):
        try:
            extra_args = shlex.split(extra_args)
        except ValueError:  # broken quoting: the Server panel says so at start
            extra_args = []
    found = {"--kv-cache-dtype": kv_cache_dtype or "auto"}
    for i, arg in enumerate(extra_args):
        name, eq, value = arg.partition("=")
        if name not in _KV_FLAGS:
            continue
        if not eq:
            if i + 1 >= len(extra_args):
                continue
            value = extra_args[i + 1]
        found[_KV_FLAGS[name]] = value
    out = []
    if found["--kv-cache-dtype"] in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        out += ["--kv-cache-dtype", found["--kv-cache-dtype"]]
    memory = found.get("--kv-cache-memory", "")
    if _SIZE.fullmatch(memory) and float(re.match(r"\s*([0-9.]+)", memory).group(1)) > 0:
        out += ["--kv-cache-memory", memory.strip()]
    seqs = found.get("--max-num-seqs", "").strip()
    if seqs.isdigit() and int(seqs) > 0:
        out += ["--max-num-seqs", seqs]
    if draft_model.strip():  # prompt lookup ("") adds no memory
        from wslm.gui.speculative import speculative_config

        out += ["--speculative-config", speculative_config(draft_model.strip())]
    return out


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
        self.kv_args: list[str] = []  # and its KV cache's flags (kv_estimate_args)
        self.kv_refused = False  # the target's wslm predates those flags: listed without them since
        self._sent_kv = False
        self._again = False  # asked while a listing ran (the settings changed): list again once it ends

    def refresh(self) -> None:
        if self._list_proc and self._list_proc.running:
            self._again = True  # its estimates may be for the settings before the change
            return
        self._again = False
        proc = JsonProcess(self)
        got: list[dict] = []
        proc.event.connect(lambda e: got.append(e))
        proc.log_line.connect(lambda line: self.logs.add("models", line))
        proc.finished.connect(lambda code, tail: self._listed(code, tail, got))
        self._list_proc = proc
        self.loading = True
        args = ["models", "list", "--json"] + (["--context", str(int(self.context))] if self.context else [])
        self._sent_kv = bool(self.kv_args) and not self.kv_refused
        args += self.kv_args if self._sent_kv else []
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
        if code == 2 and self._sent_kv and re.search(r"unrecognized arguments: --(kv-cache|max-num-seqs|speculative-config)", tail):
            # An older wslm on the target (WSL installs update apart from the app): its estimates, then.
            self.kv_refused = True
            self.logs.add("models", "this wslm has no --kv-cache-dtype/--kv-cache-memory/--max-num-seqs for `models "
                                    "list` (update it for estimates that count them): listing without them")
            self.refresh()
            return
        if self._again:
            self.refresh()  # what this one listed is shown meanwhile; the listing for the new settings follows
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
