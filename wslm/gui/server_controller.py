"""Runs `wslm serve` on the target through the launcher, and knows what state it is in.

    stopped -> starting -> loading -> ready -> stopping -> stopped
                    \\________\\_______\\--> crashed (exit, error event, or /health stops answering)

While loading, the server's `load_progress` lines update the detail ("Loading demo… 43% (312 MB/s)").

The process is a QProcess (no thread); health and /metrics are polled with QNetworkAccessManager
(asynchronous); stopping a WSL backend by its Linux PID runs on a background thread."""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass, field

from PySide6.QtCore import QCoreApplication, QEventLoop, QObject, QTimer, QUrl, Signal
from PySide6.QtNetwork import QNetworkAccessManager, QNetworkReply, QNetworkRequest

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm import defaults
from wslm.gui.background import BackgroundCall
from wslm.gui.cli_process import JsonProcess
from wslm.gui.crash_hints import CrashCause, crash_cause
from wslm.gui.log_model import LogModel
from wslm.gui.metrics import ThroughputMeter, metric, parse_prometheus
from wslm.wsl_bridge.launcher import Target, api_key_env, stop_backend

log = logging.getLogger(__name__)

STOPPED, STARTING, LOADING, READY, STOPPING, CRASHED = "stopped", "starting", "loading", "ready", "stopping", "crashed"
STATES = (STOPPED, STARTING, LOADING, READY, STOPPING, CRASHED)

HEALTH_INTERVAL_MS = 2000
HEALTH_FAILURES_TO_CRASH = 5
MAX_AUTO_RESTARTS = 3
STOP_GRACE_S = 10.0


_OWN_POLL = "127.0.0.1"
_POLL_PATHS = ('"GET /health HTTP', '"GET /metrics HTTP')


@dataclass
class ServerConfig:
    """`wslm serve` flags, named as in vLLM."""

    model: str = defaults.MODEL
    host: str = defaults.HOST
    port: int = defaults.PORT
    api_key: str = ""
    max_model_len: int = 0
    gpu_memory_utilization: float = defaults.GPU_MEMORY_UTILIZATION
    quantization: str = ""  # "": the checkpoint's own
    kv_cache_dtype: str = defaults.KV_CACHE_DTYPE
    tensor_parallel_size: int = 1
    # --model-pool: more models the server loads on request (["all"]: every installed one), so the chat's
    # picker switches models without a restart. [] : one model, as before.
    model_pool: list[str] = field(default_factory=list)
    extra_args: list[str] = field(default_factory=list)  # any other `wslm serve` flags
    speculative_config: str = ""  # --speculative-config's JSON ("": off); see wslm.gui.speculative

    def serve_args(self) -> list[str]:
        """The flags; the API key is not among them (it goes in the environment, see env())."""
        args = ["--model", self.model or defaults.MODEL, "--host", self.host, "--port", str(int(self.port))]
        if self.max_model_len:
            args += ["--max-model-len", str(int(self.max_model_len))]
        args += ["--gpu-memory-utilization", f"{float(self.gpu_memory_utilization):g}"]
        if self.quantization:
            args += ["--quantization", self.quantization]
        if self.kv_cache_dtype and self.kv_cache_dtype != defaults.KV_CACHE_DTYPE:
            args += ["--kv-cache-dtype", self.kv_cache_dtype]
        if int(self.tensor_parallel_size) > 1:
            args += ["--tensor-parallel-size", str(int(self.tensor_parallel_size))]
        if self.model_pool and not self.user_pool():
            args += ["--model-pool", *self.model_pool]
        if self.speculative_config and not self._user_flag("--speculative-config"):
            args += ["--speculative-config", self.speculative_config]
        return args + list(self.extra_args)

    def _user_flag(self, flag: str) -> bool:
        """The extra flags name `flag` themselves: theirs wins."""
        return any(a == flag or a.startswith(flag + "=") for a in self.extra_args)

    def user_pool(self) -> bool:
        """The extra flags name their own --model-pool: theirs wins."""
        return any(a == "--model-pool" or a.startswith("--model-pool=") for a in self.extra_args)

    def env(self) -> dict[str, str]:
        """Our environment plus WSLM_API_KEY (passed into WSL through WSLENV): a key on the command line
        would show in `ps` and in the log. Without a key, an inherited WSLM_API_KEY is dropped so the
        server is as open as the panel says."""
        if self.api_key:
            return api_key_env(self.api_key)
        env = dict(os.environ)
        env.pop("WSLM_API_KEY", None)
        return env

    def client_host(self) -> str:
        return "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host


_NO_POOL_FLAG = re.compile(r"unrecognized arguments:.*--model-pool")
_CLI_ADVICE = re.compile(r"`|(^|\s)--[a-z]")


def app_wording(message: str) -> str:
    """The server's own error without its command-line advice (flags, `wslm ...` commands): in the app the
    crash box names the field to change instead."""
    kept = []
    for sentence in re.split(r"(?<=\.)\s+", message.strip()):
        if _CLI_ADVICE.search(sentence):
            head = sentence.split(":", 1)[0]
            if head != sentence and not _CLI_ADVICE.search(head):
                kept.append(head.rstrip(".") + ".")
            continue
        kept.append(sentence)
    return " ".join(kept).strip()


def loading_text(event: dict) -> str:
    """The loading state's detail for a `load_progress` event: "Loading NAME… 43% (312 MB/s)"."""
    name = str(event.get("model") or "model")
    try:
        percent, rate = float(event.get("percent") or 0), float(event.get("mb_per_s") or 0)
    except (TypeError, ValueError):
        return f"Loading {name}…"
    return f"Loading {name}… {percent:.0f}% ({rate:.0f} MB/s)"


class ServerController(QObject):
    state_changed = Signal(str, str)  # state, detail (crash cause, model loading, ...); "loading" repeats with progress
    ready = Signal(dict)  # the ready event: url, host, port, model, pid
    metrics_updated = Signal(dict)  # kv_cache_usage (0..1), running, waiting, tokens_per_s
    health_changed = Signal(str)  # "ok" or an error text

    def __init__(self, logs: LogModel, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.logs = logs
        self.target = Target.local()
        self.config = ServerConfig()
        self.state = STOPPED
        self.detail = ""
        self.auto_restart = False
        self.ready_event: dict = {}
        self.last_lines: list[str] = []  # this run's last log lines (for the crash box)
        self.cause: CrashCause | None = None  # why the last run crashed
        self._log_mark = 0  # logs.added when this run started
        self._proc: JsonProcess | None = None
        self._error_message = ""
        self._restarts: list[float] = []
        self._restart_after_stop = False
        self._stop_pending = False
        self._stop_asked = 0.0  # monotonic time of the last stop request (how long the stop took)
        self._force_killed = False  # _force_kill ended the last run (its exit code is then -9, not its own)
        self._backend_pid = 0  # from the loading event
        self.pool_refused = False  # the target's wslm predates --model-pool: started without it since
        self._health_failures = 0
        self._net = QNetworkAccessManager(self)
        self._health_timer = QTimer(self, interval=HEALTH_INTERVAL_MS)
        self._health_timer.timeout.connect(self._poll)
        self._kill_timer = QTimer(self, singleShot=True)
        self._kill_timer.timeout.connect(self._force_kill)
        self._restart_timer = QTimer(self, singleShot=True)
        self._restart_timer.timeout.connect(self._auto_restart_now)
        self._throughput = ThroughputMeter()

    # Public API
    @property
    def base_url(self) -> str:
        """OpenAI base URL of the running server (…/v1), "" when not ready."""
        if self.state != READY:
            return ""
        host = self.ready_event.get("host") or self.config.client_host()
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        return f"http://{host}:{self.ready_event.get('port') or self.config.port}/v1"

    @property
    def restart_pending(self) -> bool:
        """Stopping (or just stopped) in order to start again (restart, model switch)."""
        return self._restart_after_stop

    @property
    def running(self) -> bool:
        return self.state in (STARTING, LOADING, READY, STOPPING)

    def start(self, config: ServerConfig | None = None, target: Target | None = None) -> bool:
        if self.running:
            return False
        if config is not None:
            self.config = config
        if target is not None:
            self.target = target
        self._restart_timer.stop()
        self._error_message = ""
        self.ready_event = {}
        self.last_lines = []
        self.cause = None
        self._health_failures = 0
        self._log_mark = self.logs.added
        if self.pool_refused and self.config.model_pool:
            self.config.model_pool = []
        argv = self.target.wslm_argv(["serve", *self.config.serve_args()])
        shown = ["<hidden>" if i and argv[i - 1] == "--api-key" else a for i, a in enumerate(argv)]
        self.logs.add("server", "$ " + " ".join(shown))
        proc = JsonProcess(self, keep_lines=60)
        proc.event.connect(self._on_event)
        proc.log_line.connect(self._on_log)
        proc.finished.connect(lambda code, tail, p=proc: self._on_finished(code, tail) if p is self._proc else None)
        self._proc = proc
        self._stop_pending = False
        self._force_killed = False
        self._backend_pid = 0
        self._set(STARTING, f"Starting on {self.target.describe()}…")
        proc.start(argv, env=self.config.env())
        return True

    def stop(self) -> None:
        self._stop(restart=False)

    def _stop(self, restart: bool) -> None:
        self._restart_timer.stop()
        self._restart_after_stop = restart  # set before "stopping" is announced: listeners see a restart coming
        if not self.running or self.state == STOPPING:
            if self.state == CRASHED:
                self._set(STOPPED, "")
            return
        self._set(STOPPING, "Stopping…")
        self._stop_asked = time.monotonic()
        self._health_timer.stop()
        proc = self._proc
        pid = int(self.ready_event.get("pid") or self._backend_pid or 0)
        if self.target.via_wsl and not pid:
            # No Linux PID yet (just started), and killing wsl.exe would leave the backend running in the
            # distro (it keeps serving without its stdout): stop it the moment its loading line names it.
            self._stop_pending = True
            self.logs.add("server", "will stop as soon as the backend reports its PID (it is still loading)")
            return
        self._stop_now(proc, pid)

    def _stop_now(self, proc: JsonProcess, pid: int) -> None:
        if self.target.via_wsl and pid:
            # Killing wsl.exe would leave the Linux process running: signal it by its Linux PID.
            call = BackgroundCall(lambda: stop_backend(self.target, pid, timeout=STOP_GRACE_S,
                                                       exited=proc.exited.is_set), self)
            call.failed.connect(lambda err: self.logs.add("server", f"stop: {err}"))
            call.start()
        else:
            proc.terminate()  # local: our child *is* the backend; SIGTERM shuts uvicorn down cleanly
        self._kill_timer.start(int((STOP_GRACE_S + 5) * 1000))

    def restart(self) -> None:
        if self.running and self.state != STOPPING:
            self._stop(restart=True)
        elif not self.running:
            self.start()

    def shutdown(self, wait_ms: int = 8000) -> None:
        """App exit: stop the backend and wait (a little) for it. A WSL backend that has not named its PID
        yet gets events processed until it does, so that it is stopped by that PID, never orphaned."""
        if self.running:
            self.stop()
            deadline = time.monotonic() + wait_ms / 1000
            while self._stop_pending and self._proc and self._proc.running and time.monotonic() < deadline:
                QCoreApplication.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)
            if self._proc and not self._proc.wait(max(1000, int((deadline - time.monotonic()) * 1000))):
                self._proc.kill()
                self._proc.wait(2000)

    # Process events
    def _on_event(self, event: dict) -> None:
        kind = event.get("event")
        if kind == "loading":
            # The backend's own PID (its Linux PID under WSL): what stopping it while it loads needs.
            self._backend_pid = int(event.get("pid") or 0)
            if self._stop_pending and self._backend_pid:
                self._stop_pending = False
                self._stop_now(self._proc, self._backend_pid)
            elif self.state != STOPPING:
                self._set(LOADING, f"Loading {event.get('model') or self.config.model}…")
        elif kind == "load_progress":
            if self.state == LOADING:  # a pool's later loads (after ready) are not the start's
                self._set(LOADING, loading_text(event))
        elif kind == "ready" and self._stop_pending:
            self.ready_event = event
            self._stop_now(self._proc, int(event.get("pid") or 0))
        elif kind == "ready":
            self.ready_event = event
            self.state = READY  # base_url needs it
            self._set(READY, f"{event.get('model', '')} at {self.base_url}")
            self._health_timer.start()
            self.ready.emit(event)
        elif kind == "error":
            self._error_message = str(event.get("message", ""))
            self.logs.add("server", f"error: {self._error_message}")

    def _on_log(self, line: str) -> None:
        if _OWN_POLL in line and '" 200' in line and any(p in line for p in _POLL_PATHS):
            return  # our own /health and /metrics polls, every 2 s: noise in the log
        self.logs.add("server", line)

    def _on_finished(self, code: int, tail: str) -> None:
        self._kill_timer.stop()
        self._health_timer.stop()
        self.last_lines = self.logs.since(self._log_mark, "server", 12)
        was = self.state
        if was == STOPPING:
            self._set(STOPPED, self._stopped_words(code))
            if self._restart_after_stop:
                self._restart_after_stop = False
                QTimer.singleShot(0, self.start)
            return
        if was == STARTING and self.config.model_pool and not self.config.user_pool() \
                and _NO_POOL_FLAG.search(tail + "\n" + "\n".join(self.last_lines)):
            # An older wslm on the target (WSL installs update apart from the app): serve one model, as it
            # can; the chat's picker then switches models by restarting it.
            self.pool_refused = True
            self.logs.add("server", "this wslm has no --model-pool (update it for switching models without a "
                                    "restart): starting without it")
            self.state = STOPPED  # not announced: the start that follows says "starting" again
            QTimer.singleShot(0, self.start)
            return
        self.cause = crash_cause(code, [*self.last_lines, *tail.splitlines()], self._error_message)
        said = app_wording(self._error_message)
        msg = f"{self.cause.title}. {said + ' ' if said else ''}{self.cause.advice}"
        self._set(CRASHED, msg)
        self._maybe_restart()

    def _stopped_words(self, code: int) -> str:
        """How a stop we asked for ended, in words: a clean exit is just "Stopped"."""
        took = time.monotonic() - self._stop_asked if self._stop_asked else 0.0
        self._stop_asked = 0.0
        if self._force_killed:
            self._force_killed = False
            clean = any("Finished server process" in line for line in self.last_lines)
            return (f"Stopped: it {'shut down' if clean else 'was asked to stop'} but its process had not exited "
                    f"after {took:.0f} s, so it was ended")
        if code == 0 or (code == -15 and not self.target.via_wsl):  # its own exit, or our SIGTERM unhandled
            return "Stopped"
        return f"Stopped (exit code {code})"

    def _force_kill(self) -> None:
        if self._proc and self._proc.running:
            self.logs.add("server", f"backend did not stop within {STOP_GRACE_S + 5:.0f} s; killing it")
            self._force_killed = True
            self._proc.kill()

    def _maybe_restart(self) -> None:
        if not self.auto_restart:
            return
        now = time.monotonic()
        self._restarts = [t for t in self._restarts if now - t < 300]
        if len(self._restarts) >= MAX_AUTO_RESTARTS:
            self.logs.add("server", f"auto-restart gave up after {MAX_AUTO_RESTARTS} crashes in 5 minutes")
            return
        self._restarts.append(now)
        delay = 2 ** len(self._restarts)
        self.logs.add("server", f"auto-restart in {delay} s")
        self._restart_timer.start(delay * 1000)

    def _auto_restart_now(self) -> None:
        if self.state == CRASHED:
            self.start()

    def _set(self, state: str, detail: str) -> None:
        self.state, self.detail = state, detail
        self.state_changed.emit(state, detail)

    # Health and metrics
    def _poll(self) -> None:
        base = self.base_url
        if not base:
            return
        root = base[: -len("/v1")]
        for path, handler in (("/health", self._on_health), ("/metrics", self._on_metrics)):
            req = QNetworkRequest(QUrl(root + path))
            req.setTransferTimeout(HEALTH_INTERVAL_MS + 1000)
            if self.config.api_key:
                req.setRawHeader(b"Authorization", f"Bearer {self.config.api_key}".encode())
            reply = self._net.get(req)
            reply.finished.connect(lambda r=reply, h=handler: h(r))

    def _on_health(self, reply: QNetworkReply) -> None:
        reply.deleteLater()
        if self.state != READY:
            return
        if reply.error() == QNetworkReply.NetworkError.NoError:
            if self._health_failures:
                self.health_changed.emit("ok")
            self._health_failures = 0
            return
        self._health_failures += 1
        self.health_changed.emit(reply.errorString())
        if self._health_failures >= HEALTH_FAILURES_TO_CRASH:
            self._error_message = f"/health did not answer {self._health_failures} times ({reply.errorString()})"
            self.logs.add("server", self._error_message)
            # The process is hung: end it; _on_finished then reports the crash (and restarts if asked).
            self._health_timer.stop()
            self._kill_hung()

    def _kill_hung(self) -> None:
        proc = self._proc
        if proc is None:
            return
        pid = int(self.ready_event.get("pid") or 0)
        if not (self.target.via_wsl and pid):
            proc.kill()  # local: our child is the backend
            return
        # Through WSL, killing wsl.exe would leave the Linux process hanging: TERM, then KILL, by its PID.
        call = BackgroundCall(lambda: stop_backend(self.target, pid, timeout=1.0, exited=proc.exited.is_set), self)
        call.done.connect(lambda _r: proc.kill())
        call.failed.connect(lambda err: (self.logs.add("server", f"kill: {err}"), proc.kill()))
        call.start()

    def _on_metrics(self, reply: QNetworkReply) -> None:
        reply.deleteLater()
        if reply.error() != QNetworkReply.NetworkError.NoError:
            return
        values = parse_prometheus(bytes(reply.readAll().data()).decode("utf-8", "replace"))
        rate = self._throughput.update(time.monotonic(), metric(values, "generation_tokens_total"))
        self.metrics_updated.emit({
            "kv_cache_usage": metric(values, "kv_cache_usage_perc"),
            "running": metric(values, "num_requests_running"),
            "waiting": metric(values, "num_requests_waiting"),
            "tokens_per_s": rate,
            "generation_tokens_total": metric(values, "generation_tokens_total"),
            "prompt_tokens_total": metric(values, "prompt_tokens_total"),
        })
