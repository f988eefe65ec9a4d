"""A real `wslm serve` process on loopback for the server tests (and unit tests of the launcher's parsing and
the metrics text). Other server test modules import ServerProcess from here."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Small KV pool and context: quick to allocate, plenty for a few dozen short requests.
SMALL = ["--kv-cache-memory", "96MiB", "--max-model-len", "1024", "--uvicorn-log-level", "warning"]


class ServerProcess:
    """`python -m wslm serve --port 0 ...`, waited on through its JSON lines on stdout."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, wait: bool = True,
                 timeout: float = 180.0, new_session: bool = False) -> None:
        self.log = tempfile.NamedTemporaryFile("w+", prefix="wslm-serve-", suffix=".log", delete=False)
        full_env = {**os.environ, "WSLM_CONFIG_DIR": tempfile.mkdtemp(prefix="wslm-cfg-"), **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "wslm", "serve", *args],
            stdout=subprocess.PIPE, stderr=self.log, text=True, cwd=REPO, env=full_env,
            start_new_session=new_session,  # its own process group: a terminal's Ctrl-C, os.killpg(pid, SIGINT)
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stdout_lines: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self.events: list[dict] = []
        self.ready: dict | None = None
        if wait:
            event = self.wait_event(("ready", "error"), timeout)
            if event["event"] != "ready":
                self.stop()
                raise AssertionError(f"server failed to start: {event}\n{self.stderr()[-3000:]}")

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stdout_lines.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def wait_event(self, kinds: tuple[str, ...], timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {kinds} event within {timeout}s\n{self.stderr()[-3000:]}") from None
            if line is None:
                raise AssertionError(f"server exited ({self.proc.wait()}) before {kinds}\n{self.stderr()[-3000:]}")
            event = json.loads(line)  # every stdout line must be JSON
            self.events.append(event)
            if event["event"] == "ready":
                self.ready = event
            if event["event"] in kinds:
                return event

    @property
    def url(self) -> str:
        assert self.ready is not None
        return self.ready["url"]

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def stderr(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def serve_in_thread(state) -> tuple[str, object, threading.Thread]:
    """The real app (build_app) for a ServerState, under uvicorn in a thread of this process, on a free
    loopback port: (base URL, the uvicorn server, its thread). Stop with server.should_exit = True."""
    import socket

    import uvicorn

    from wslm.backend.entrypoints.openai.app import build_app

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(build_app(state), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server, thread


def metric(text: str, name: str, labels: str = "") -> float:
    """The value of one sample in Prometheus text, e.g. metric(t, "wslm:num_requests_running")."""
    pattern = re.escape(name) + r"\{[^}]*" + re.escape(labels) + r"[^}]*\} (\S+)$"
    for line in text.splitlines():
        m = re.match(pattern, line)
        if m:
            return float(m.group(1))
    raise AssertionError(f"{name}{{{labels}}} not in /metrics")


# ---- units: pure helpers of the launcher and the metrics text -------------------------------------------
def test_parse_size_and_model_len():
    from wslm.backend.entrypoints.openai.launcher import StartupError, parse_model_len, parse_size

    assert parse_size("4GiB") == 4 << 30
    assert parse_size("512M") == 512 << 20
    assert parse_size("1000") == 1000
    assert parse_size(None) is None
    with pytest.raises(StartupError, match="--kv-cache-memory"):
        parse_size("lots")
    assert parse_model_len("4k") == 4000 and parse_model_len("4K") == 4096 and parse_model_len("2048") == 2048
    with pytest.raises(StartupError, match="--max-model-len"):
        parse_model_len("long")


def test_metrics_text_format():
    from wslm.backend.frontend.metrics import ServerMetrics

    m = ServerMetrics("demo")
    m.set_engine_stats({"num_requests_running": 2, "kv_cache_usage": 0.25, "prefix_cache_queries": 10,
                        "prefix_cache_hits": 4})
    m.observe_first_token(0.03)
    m.observe_first_token(7.0)
    m.observe_tokens(0.05, 1)
    m.observe_finished(1.2, ["stop"])
    text = m.render()
    assert metric(text, "wslm:num_requests_running") == 2
    assert metric(text, "wslm:kv_cache_usage_perc") == 0.25
    assert metric(text, "wslm:prefix_cache_hit_rate") == 0.4
    assert metric(text, "wslm:time_to_first_token_seconds_bucket", 'le="0.04"') == 1
    assert metric(text, "wslm:time_to_first_token_seconds_bucket", 'le="+Inf"') == 2
    assert metric(text, "wslm:time_to_first_token_seconds_count") == 2
    assert metric(text, "wslm:time_to_first_token_seconds_sum") == pytest.approx(7.03)
    assert metric(text, "wslm:request_success_total", 'finished_reason="stop"') == 1
    assert "# TYPE wslm:inter_token_latency_seconds histogram" in text
    assert "# TYPE wslm:prompt_tokens_total counter" in text
    # Every sample line is `name{labels} number`.
    for line in text.splitlines():
        if not line.startswith("#"):
            assert re.fullmatch(r'[a-z0-9_:]+\{[^}]*\} -?[0-9.e+-]+(inf)?', line), line
