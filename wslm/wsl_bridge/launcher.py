"""Run `wslm ...` on the Linux side, locally or in a WSL distro, and stop a backend reliably.

    from wslm.wsl_bridge.launcher import Target, start_backend, stop_backend, check_port

    target = Target.wsl("Ubuntu")             # or Target.local() on Linux / inside WSL
    argv = target.wslm_argv(["serve", "--port", "8000"])   # for QProcess: program=argv[0], args=argv[1:]
    proc = start_backend(target, ["--port", "8000"], on_line=print)
    ready = proc.wait_ready(timeout=120)      # ReadyEvent(url, host, port, model, pid) or None
    proc.stop()                               # kill -TERM <Linux pid>, then -KILL after a timeout

The argv never goes through a Windows shell. Through WSL it is
``wsl.exe -d DISTRO -- <each argument quoted for the Linux shell>`` (see linux_quote for why).
Locally it is ``[sys.executable, "-m", "wslm", ...]``, so the same Python environment runs it.

Stopping: killing wsl.exe does not kill the Linux process, so the backend's own PID (from its
``{"event": "ready", ..., "pid": N}`` JSON line on stdout) is signalled inside the target:
``kill -TERM N``, then ``kill -KILL N`` when it has not exited after `timeout` seconds.
`stop_backend(target, pid)` does just that for callers that run the process themselves (the GUI's
QProcess); it blocks, so call it from a worker thread.

Ports: `check_port(target, port)` reports LISTEN sockets on the port inside the target and, on
Windows, whether the port lies in one of Windows' excluded port ranges.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from wslm.wsl_bridge import ports, winexec
from wslm.wsl_bridge.errors import ValidationError, WslError
from wslm.wsl_bridge.linux_quote import quote_all
from wslm.wsl_bridge.validate import validate_distro, validate_pid, validate_port

LineCallback = Callable[[str, str], None]  # (stream "stdout"|"stderr", line without newline)


@dataclass(frozen=True)
class Target:
    """Where Linux commands run: locally (`distro` None, `via_wsl` False) or in a WSL distro
    (`via_wsl` True; `distro` None means WSL's default distro)."""

    via_wsl: bool = False
    distro: str | None = None
    # How to start wslm on the target. Through WSL the default shell's PATH is used (non-login), so
    # installers that put wslm elsewhere pass e.g. ("/home/me/.wslm/venv/bin/wslm",).
    wslm_command: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.distro is not None:
            validate_distro(self.distro)
        for part in self.wslm_command:
            if not isinstance(part, str) or not part or "\x00" in part:
                raise ValidationError(f"invalid wslm command part {part!r}", "pass non-empty strings")

    @classmethod
    def local(cls, wslm_command: Sequence[str] = ()) -> Target:
        return cls(via_wsl=False, distro=None, wslm_command=tuple(wslm_command))

    @classmethod
    def wsl(cls, distro: str | None = None, wslm_command: Sequence[str] = ()) -> Target:
        return cls(via_wsl=True, distro=distro, wslm_command=tuple(wslm_command))

    @classmethod
    def default(cls, distro: str | None = None) -> Target:
        """A WSL target on Windows (or with WSLM_WINDOWS_BIN), else local."""
        return cls.wsl(distro) if winexec.is_windows() else cls.local()

    def describe(self) -> str:
        if not self.via_wsl:
            return "this machine"
        return f"WSL distro {self.distro}" if self.distro else "the default WSL distro"

    def program_argv(self, program: str, args: Sequence[str] = ()) -> list[str]:
        """argv that runs a Linux program with args on the target."""
        argv = [program, *args]
        for a in argv:
            if not isinstance(a, str):
                raise ValidationError(f"argument {a!r} is not a string", "pass command arguments as str")
        if not self.via_wsl:
            return argv
        head = [winexec.windows_tool("wsl.exe")]
        if self.distro:
            head += ["-d", self.distro]
        return [*head, "--", *quote_all(argv)]

    def wslm_argv(self, args: Sequence[str]) -> list[str]:
        """argv that runs `wslm <args>` on the target."""
        if self.wslm_command:
            command = list(self.wslm_command)
        elif self.via_wsl:
            command = ["wslm"]
        else:
            command = [sys.executable, "-m", "wslm"]
        return self.program_argv(command[0], [*command[1:], *args])

    def run(self, program: str, args: Sequence[str] = (), *, timeout: float = 60.0) -> winexec.Result:
        """Run a short Linux command on the target and wait for it."""
        argv = self.program_argv(program, args)
        result = winexec.run(argv, timeout=timeout)
        if self.via_wsl:
            _raise_for_wsl_failure(self, result)
        return result


def _raise_for_wsl_failure(target: Target, result: winexec.Result) -> None:
    """wsl.exe's own errors (not the Linux command's) become WslError with a fix."""
    text = result.output
    if result.ok:
        return
    if "no distribution with the supplied name" in text.lower() or "WSL_E_DISTRO_NOT_FOUND" in text:
        raise WslError(f"{target.describe()} is not installed", "see `wslm wsl list` for installed distros")
    if "has no installed distributions" in text:
        raise WslError("WSL has no installed distributions", "install one: wsl --install -d Ubuntu")


@dataclass
class ReadyEvent:
    """`wslm serve`'s ready line: where it listens and its Linux PID."""

    url: str
    host: str
    port: int
    model: str
    pid: int
    raw: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def parse_event(line: str) -> dict | None:
    """The JSON object on a stdout line of `wslm ...` (None for plain log lines)."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and "event" in obj else None


def parse_ready(event: dict | None) -> ReadyEvent | None:
    """A ReadyEvent from a parsed event dict, or None when it is not a valid ready event."""
    if not event or event.get("event") != "ready":
        return None
    try:
        return ReadyEvent(url=str(event.get("url", "")), host=str(event.get("host", "")),
                          port=int(event.get("port", 0)), model=str(event.get("model", "")),
                          pid=validate_pid(int(event["pid"])), raw=dict(event))
    except (KeyError, TypeError, ValueError):
        return None


@dataclass
class StopResult:
    pid: int
    signals: list[str]  # what was sent: [], ["TERM"], ["TERM", "KILL"]
    exited: bool
    already_gone: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def _local_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) answers kill -0 but is gone for our purposes.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _signal(target: Target, pid: int, sig: str) -> bool:
    """Send a signal; False when the process does not exist."""
    if not target.via_wsl:
        import signal

        try:
            os.kill(pid, {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL, "0": 0}[sig])
        except ProcessLookupError:
            return False
        return True if sig != "0" else _local_alive(pid)
    return target.run("kill", [f"-{sig}", str(pid)], timeout=30).ok


def stop_backend(target: Target, pid: int, timeout: float = 10.0, poll_interval: float = 0.2,
                 exited: Callable[[], bool] | None = None) -> StopResult:
    """Stop the Linux process `pid` on `target`: SIGTERM, wait up to `timeout` s, then SIGKILL.
    `exited` (optional) tells early that the process is gone (e.g. the caller's QProcess finished).
    Blocks; call it off the GUI thread."""
    pid = validate_pid(pid)
    if not _signal(target, pid, "TERM"):
        return StopResult(pid, [], True, already_gone=True)
    sent = ["TERM"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (exited and exited()) or not _signal(target, pid, "0"):
            return StopResult(pid, sent, True)
        time.sleep(poll_interval)
    _signal(target, pid, "KILL")
    sent.append("KILL")
    for _ in range(25):
        if (exited and exited()) or not _signal(target, pid, "0"):
            return StopResult(pid, sent, True)
        time.sleep(poll_interval)
    return StopResult(pid, sent, False)


class BackendProcess:
    """A running `wslm ...` command with its stdout/stderr read line by line on background threads.

    `on_line(stream, line)` is called from those threads for every line; JSON event lines are also
    collected in `events`, and the ready event in `ready`."""

    def __init__(self, target: Target, argv: list[str], on_line: LineCallback | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.target = target
        self.argv = argv
        self.on_line = on_line
        self.events: list[dict] = []
        self.ready: ReadyEvent | None = None
        self._ready_flag = threading.Event()
        self._lock = threading.Lock()
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, env=env,
                                         creationflags=winexec.no_window_flags())
        except FileNotFoundError as exc:
            raise WslError(f"cannot start {argv[0]}: {exc.strerror}",
                           "install wslm on the target (see installer/) or pass wslm_command") from None
        self._threads = [threading.Thread(target=self._pump, args=(self.proc.stdout, "stdout"), daemon=True),
                         threading.Thread(target=self._pump, args=(self.proc.stderr, "stderr"), daemon=True)]
        for t in self._threads:
            t.start()

    def _pump(self, stream, name: str) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if name == "stdout":
                event = parse_event(line)
                if event is not None:
                    with self._lock:
                        self.events.append(event)
                    ready = parse_ready(event)
                    if ready and self.ready is None:
                        self.ready = ready
                        self._ready_flag.set()
            if self.on_line:
                try:
                    self.on_line(name, line)
                except Exception:  # a faulty callback must not stop the reader (the pipe would fill up)
                    pass
        stream.close()
        if name == "stdout":
            self._ready_flag.set()  # wake wait_ready(): the process closed stdout without being ready

    @property
    def pid(self) -> int | None:
        """The Linux PID (from the ready event); not the PID of the local wsl.exe."""
        return self.ready.pid if self.ready else None

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        code = self.proc.wait(timeout)
        for t in self._threads:
            t.join(timeout=5)
        return code

    def wait_ready(self, timeout: float | None = None) -> ReadyEvent | None:
        """Block until the ready event (returned), the end of stdout, or the timeout (None)."""
        self._ready_flag.wait(timeout)
        return self.ready

    def stop(self, timeout: float = 10.0) -> StopResult | None:
        """Stop the backend (see stop_backend), then make sure the local process has ended too."""
        result = None
        if self.ready and self.proc.poll() is None:
            result = stop_backend(self.target, self.ready.pid, timeout=timeout,
                                  exited=lambda: self.proc.poll() is not None)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.wait(timeout=10)
        return result


def run_wslm(target: Target, args: Sequence[str], on_line: LineCallback | None = None,
             env: dict[str, str] | None = None) -> BackendProcess:
    """Start `wslm <args>` on the target, streaming its lines to on_line."""
    return BackendProcess(target, target.wslm_argv(list(args)), on_line=on_line, env=env)


def start_backend(target: Target, serve_args: Sequence[str] = (), on_line: LineCallback | None = None,
                  env: dict[str, str] | None = None) -> BackendProcess:
    """Start `wslm serve <serve_args>` on the target (wait_ready() for its ReadyEvent)."""
    return run_wslm(target, ["serve", *serve_args], on_line=on_line, env=env)


def serve_args_for_share(port: int, api_key: str) -> list[str]:
    """The `wslm serve` flags a LAN-shared backend needs (vLLM's names): all interfaces, with a key."""
    return ["--host", "0.0.0.0", "--port", str(validate_port(port)), "--api-key", api_key]


def api_key_env(api_key: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment for start_backend that hands the key to `wslm serve` as WSLM_API_KEY (through
    WSLENV into WSL) instead of on the command line, where `ps` inside WSL would show it."""
    env = dict(os.environ if base is None else base)
    env["WSLM_API_KEY"] = api_key
    names = [n for n in env.get("WSLENV", "").split(":") if n and n.split("/")[0] != "WSLM_API_KEY"]
    env["WSLENV"] = ":".join([*names, "WSLM_API_KEY"])
    return env


@dataclass
class PortStatus:
    """Who holds `port`: LISTEN sockets inside the target, and a Windows excluded range if any."""

    port: int
    listeners: list[str]  # listen addresses inside the target, e.g. ["127.0.0.1"] or ["0.0.0.0"]
    excluded_range: tuple[int, int] | None = None

    @property
    def in_use(self) -> bool:
        return bool(self.listeners)

    @property
    def free(self) -> bool:
        return not self.listeners and self.excluded_range is None

    def problems(self) -> list[str]:
        out = []
        if self.listeners:
            out.append(f"port {self.port} is already in use ({', '.join(self.listeners)}); "
                       f"stop that program or choose another --port")
        if self.excluded_range:
            a, b = self.excluded_range
            out.append(f"port {self.port} is reserved by Windows (excluded range {a}-{b}, usually Hyper-V); "
                       f"choose a port outside it")
        return out

    def to_dict(self) -> dict:
        return {"port": self.port, "in_use": self.in_use, "free": self.free, "listeners": self.listeners,
                "excluded_range": list(self.excluded_range) if self.excluded_range else None,
                "problems": self.problems()}


def listening_addresses(target: Target, port: int) -> list[str]:
    """Addresses with a TCP socket listening on `port` inside the target."""
    port = validate_port(port)
    if target.via_wsl:
        # cat prints what it can: tcp6 is missing when IPv6 is disabled, which is fine.
        text = target.run("cat", ["/proc/net/tcp", "/proc/net/tcp6"], timeout=30).stdout
    else:
        parts = []
        for name in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                parts.append(Path(name).read_text())
            except OSError:
                pass
        if not parts:
            return _bind_probe(port)
        text = "\n".join(parts)
    return sorted({addr for addr, p in ports.parse_proc_net_tcp(text) if p == port})


def _bind_probe(port: int) -> list[str]:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return ["0.0.0.0"]
    return []


def check_port(target: Target, port: int) -> PortStatus:
    """Whether `port` is free for a backend on `target` (inside WSL, and Windows' excluded ranges)."""
    port = validate_port(port)
    excluded = ports.excluded_range_for(port) if winexec.is_windows() else None
    return PortStatus(port, listening_addresses(target, port), excluded)
