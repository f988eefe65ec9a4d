"""Each served model's engine core runs in a child process (engine/core_client.py MPClient): kill -9 of one
pooled model's core answers its requests 503 within a second, the next request loads it again, and another
model's stream goes on; the same for the default (--model) model's core, whose next request starts a new core
(frontend/core_restart.py) while the server goes on; the server leaves no core process behind after SIGTERM,
SIGKILL or Ctrl-C. Real `wslm serve` processes with tiny random models (a load takes a second)."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import psutil
import pytest
from test_server_helpers import ServerProcess, metric
from test_server_model_pool import make_tiny_chat_model


# The target is a 503 within a second of the kill. The time is taken from the kill to the answer read by this
# test's own client thread, so on an oversubscribed machine (the suite runs beside other jobs: load 12 on 2
# cores was seen) every hop, the client's included, waits its turn for a core: the limit grows with the load
# per core, up to 5 s, still far below what a missed death costs (the client's 120 s timeout).
def _answer_limit() -> float:
    per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    return min(5.0, max(1.0, per_core))


def _core(pid: int, model: str) -> psutil.Process:
    """The server's core process of one model: core_proc names it `wslm:MODEL` (ps, top)."""
    found = [p for p in _children(pid) if p.name() == f"wslm:{model}"[:15]]
    assert len(found) == 1, [(p.pid, p.name()) for p in _children(pid)]
    return found[0]


FLAGS = ["--port", "0", "--kv-cache-memory", "16MiB", "--max-model-len", "512", "--enforce-eager",
         "--uvicorn-log-level", "warning"]


def _children(pid: int) -> list[psutil.Process]:
    try:
        return [p for p in psutil.Process(pid).children() if p.status() != psutil.STATUS_ZOMBIE]
    except psutil.NoSuchProcess:
        return []


def _gone(pids: list[int], timeout: float) -> list[int]:
    """The pids still running (not zombies) after waiting up to timeout."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _kill_while_running(url: str, model: str, core_pid: int) -> tuple[dict, float, float]:
    """SIGKILL a model's core while a request of its own runs; (that request's answer, the kill's time, the
    answer's time limit)."""
    answer: dict = {}
    killing = threading.Event()

    def doomed() -> None:
        # Requests one after another until the kill: on a fast CPU one can finish between two polls of
        # /metrics below, and then the next one is the request the kill meets.
        while True:
            resp = httpx.post(url + "/v1/chat/completions", json=_body(model, 400), timeout=120)
            if killing.is_set() or resp.status_code != 200:
                answer.update(status=resp.status_code, body=resp.json(), at=time.monotonic())
                return

    victim = threading.Thread(target=doomed)
    victim.start()
    deadline = time.monotonic() + 60
    while metric(httpx.get(url + "/metrics", timeout=30).text, "wslm:num_requests_running",
                 f'model_name="{model}"') < 1:  # fmt: skip
        assert time.monotonic() < deadline and victim.is_alive(), answer
        time.sleep(0.02)
    limit = _answer_limit()
    killing.set()
    killed_at = time.monotonic()
    os.kill(core_pid, signal.SIGKILL)
    victim.join(30)
    return answer, killed_at, limit


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    make_tiny_chat_model(folder / "first")
    make_tiny_chat_model(folder / "second")
    return folder


@pytest.fixture(scope="module")
def server(models):
    srv = ServerProcess(*FLAGS, "--model", str(models / "first"), "--served-model-name", "first",
                        "--model-pool", "second", env={"WSLM_MODELS_DIR": str(models)}, new_session=True)
    yield srv
    srv.stop()


def _body(model: str, n: int, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": n, "temperature": 0,
            "ignore_eos": True, **extra}


def test_killing_one_pooled_core_fails_its_requests_fast_and_the_next_request_reloads_it(server):
    url = server.url
    default_core = _children(server.proc.pid)
    assert len(default_core) == 1  # the default model's core, started with the server
    r = httpx.post(url + "/v1/chat/completions", json=_body("second", 2), timeout=120)
    assert r.status_code == 200, r.text
    second_core = [p for p in _children(server.proc.pid) if p.pid != default_core[0].pid]
    assert len(second_core) == 1
    # A stream on the default model, running while the other model's core dies.
    chunks: list[str] = []

    def stream() -> None:
        with httpx.stream("POST", url + "/v1/chat/completions", json=_body("first", 300, stream=True),
                          timeout=120) as resp:
            chunks.extend(line for line in resp.iter_lines() if line.startswith("data: "))

    streamer = threading.Thread(target=stream)
    streamer.start()
    answer, killed_at, limit = _kill_while_running(url, "second", second_core[0].pid)
    assert answer["status"] == 503, answer
    assert answer["at"] - killed_at < limit, (answer["at"] - killed_at, limit)  # ~0.03 s at load 5 on 2 cores
    error = answer["body"]["error"]
    assert error["code"] == "engine_dead", error
    assert "engine core process stopped" in error["message"] and "SIGKILL" in error["message"], error
    assert "starts the model's core again" in error["message"], error
    # The other model's stream was never broken.
    streamer.join(120)
    assert chunks[-1] == "data: [DONE]" and '"finish_reason":"length"' in chunks[-2].replace(" ", ""), chunks[-3:]
    # The next request loads the model again, in a new core process.
    r = httpx.post(url + "/v1/chat/completions", json=_body("second", 3), timeout=120)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text
    cores = {p.pid for p in _children(server.proc.pid)}
    assert default_core[0].pid in cores and second_core[0].pid not in cores and len(cores) == 2


def test_killing_the_default_models_core_fails_its_requests_fast_and_the_next_request_restarts_it(server):
    """`wslm serve MODEL` goes on when MODEL's core dies (it used to exit): as for a pooled model."""
    url = server.url
    r = httpx.post(url + "/v1/chat/completions", json=_body("second", 2), timeout=120)  # loaded, if not yet
    assert r.status_code == 200, r.text
    first, second = _core(server.proc.pid, "first"), _core(server.proc.pid, "second")
    chunks: list[str] = []

    def stream() -> None:  # the other model streams through the death and the restart
        with httpx.stream("POST", url + "/v1/chat/completions", json=_body("second", 300, stream=True),
                          timeout=120) as resp:
            chunks.extend(line for line in resp.iter_lines() if line.startswith("data: "))

    streamer = threading.Thread(target=stream)
    streamer.start()
    answer, killed_at, limit = _kill_while_running(url, "first", first.pid)
    assert answer["status"] == 503, answer
    assert answer["at"] - killed_at < limit, (answer["at"] - killed_at, limit)
    error = answer["body"]["error"]
    assert error["code"] == "engine_dead" and "SIGKILL" in error["message"], error
    assert "starts the model's core again" in error["message"], error
    assert server.proc.poll() is None  # the server goes on
    assert httpx.get(url + "/health", timeout=30).status_code == 200
    # The next request starts a new core and is served by it.
    r = httpx.post(url + "/v1/chat/completions", json=_body("first", 3), timeout=120)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text
    assert _core(server.proc.pid, "first").pid != first.pid
    streamer.join(120)
    assert chunks[-1] == "data: [DONE]" and '"finish_reason":"length"' in chunks[-2].replace(" ", ""), chunks[-3:]
    assert _core(server.proc.pid, "second").pid == second.pid  # the other model was never touched
    text = httpx.get(url + "/metrics", timeout=30).text
    assert metric(text, "wslm:engine_core_deaths_total", 'model_name="first"') == 1
    assert metric(text, "wslm:engine_core_restarts_total", 'model_name="first"') == 1
    assert "The engine core of the model 'first' runs again (restart 1" in server.stderr()


def test_a_core_that_cannot_start_again_answers_503_naming_why_and_the_next_request_tries_again(server, models):
    weights = models / "first" / "model.safetensors"
    # The test above logged this model's first death: wait for one more (a request sent before the engine loop
    # sees this death meets it in the step, and is answered with the death, not the failed restart).
    died = "The engine core of the model 'first' stopped"
    deaths = server.stderr().count(died)
    os.kill(_core(server.proc.pid, "first").pid, signal.SIGKILL)
    weights.rename(weights.with_suffix(".away"))  # the restart cannot load the model now
    try:
        deadline = time.monotonic() + 30  # an idle core's death is seen within a second (the engine loop checks)
        while server.stderr().count(died) <= deaths:
            assert time.monotonic() < deadline, server.stderr()[-2000:]
            time.sleep(0.05)
        r = httpx.post(server.url + "/v1/chat/completions", json=_body("first", 2), timeout=120)
        error = r.json()["error"]
        assert r.status_code == 503 and error["code"] == "engine_dead", error
        assert "starting it again failed" in error["message"] and "No weights" in error["message"], error
        assert "stopped earlier (killed by SIGKILL" in error["message"], error
        assert "The next request tries again" in error["message"], error
    finally:
        weights.with_suffix(".away").rename(weights)
    r = httpx.post(server.url + "/v1/chat/completions", json=_body("first", 2), timeout=120)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text
    assert server.proc.poll() is None


def test_ctrl_c_leaves_no_core_behind(server):
    # A terminal's Ctrl-C signals the whole process group: the server and its cores (the server runs in a
    # session of its own here, as in a terminal).
    cores = [p.pid for p in _children(server.proc.pid)]
    assert len(cores) == 2  # the default model's (restarted by the test above) and the pooled one's
    os.killpg(server.proc.pid, signal.SIGINT)
    assert server.proc.wait(60) == 0
    assert _gone(cores, 10) == []


def test_no_core_left_after_sigterm_or_sigkill_of_the_server(models):
    # Each server runs a pooled model too: its core was started for a worker thread of the pool (the kernel's
    # parent-death signal follows the thread that forked: core_client starts cores from a lasting thread).
    servers = {sig: ServerProcess(*FLAGS, "--model", str(models / "first"), "--model-pool", "second", wait=False,
                                  env={"WSLM_MODELS_DIR": str(models)})
               for sig in (signal.SIGTERM, signal.SIGKILL)}
    try:
        for srv in servers.values():
            event = srv.wait_event(("ready", "error"), 180)
            assert event["event"] == "ready", srv.stderr()[-3000:]
            r = httpx.post(srv.url + "/v1/chat/completions", json=_body("second", 2), timeout=120)
            assert r.status_code == 200, r.text
        for sig, srv in servers.items():
            cores = [p.pid for p in _children(srv.proc.pid)]
            assert len(cores) == 2
            srv.proc.send_signal(sig)
            srv.proc.wait(60)
            # SIGTERM: stopped by the server; SIGKILL: the kernel kills each core with its parent
            # (PR_SET_PDEATHSIG), else its getppid watch within a quarter second.
            assert _gone(cores, 10) == [], (sig, srv.stderr()[-2000:])
    finally:
        for srv in servers.values():
            srv.stop()
