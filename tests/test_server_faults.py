"""When something breaks inside the server, the client gets a 500 (or an in-band SSE error) with a message,
never a traceback, and the server keeps serving.

A broken engine cannot be produced on demand with the real model, so this module runs the real app, engine
loop and uvicorn on loopback around a small stand-in with LLMEngine's API (add_request / abort_request /
step / has_unfinished_requests / apply_chat_template / get_stats) that fails on cue."""

from __future__ import annotations

import time
from types import SimpleNamespace

import httpx
import openai
import pytest

from wslm.backend.errors import ErrorKind
from wslm.backend.outputs import CompletionOutput, RequestOutput


class ByteTokenizer:
    """One token per byte: enough for the HTTP layer."""

    def __len__(self) -> int:
        return 256

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if "BREAK_TOKENIZER" in text:
            raise RuntimeError("tokenizer exploded")
        return list(text.encode())

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode(errors="replace")


class FlakyEngine:
    """Emits "x" per step; prompt text FAIL_STEP makes step() raise, ENGINE_ERROR fails the request the way
    LLMEngine does when a forward pass raises (finish_reason "error")."""

    def __init__(self) -> None:
        self.tokenizer = ByteTokenizer()
        self.model_config = type("MC", (), {"max_model_len": 512, "vocab_size": 256})()
        self.model_name = "flaky"
        self.requests: dict[str, list] = {}

    def process(self, request_id, prompt, params, arrival_time=None, **names):
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        return SimpleNamespace(request_id=request_id, prompt_token_ids=ids, params=params, arrival_time=arrival_time)

    def add_engine_request(self, request) -> None:
        self.requests[request.request_id] = [request.prompt_token_ids, request.params, 0]

    def abort_request(self, request_id) -> None:
        for rid in [request_id] if isinstance(request_id, str) else request_id:
            self.requests.pop(rid, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[RequestOutput]:
        time.sleep(0.01)
        outputs = []
        for rid, entry in list(self.requests.items()):
            prompt, params, done = entry
            text = bytes(prompt).decode()
            if "FAIL_STEP" in text:
                raise RuntimeError("scheduler bug")
            if "KILL_ENGINE" in text:
                from wslm.backend.errors import EngineDeadError

                raise EngineDeadError("workers gone")
            if "ENGINE_OOM" in text:
                del self.requests[rid]
                outputs.append(RequestOutput(rid, None, prompt, [CompletionOutput(0, "", [], finish_reason="error")],
                                             True, error="Out of memory while running this request (MemoryError)",
                                             error_kind=ErrorKind.OUT_OF_MEMORY))
                continue
            if "ENGINE_ERROR" in text:
                del self.requests[rid]
                outputs.append(RequestOutput(rid, None, prompt, [CompletionOutput(0, "", [], finish_reason="error")],
                                             True, error="The engine failed on this request: boom"))
                continue
            entry[2] = done = done + 1
            finish = "length" if done >= params.max_tokens else None
            if finish:
                del self.requests[rid]
            outputs.append(RequestOutput(rid, None, prompt, [CompletionOutput(0, "x", [120], finish_reason=finish)],
                                         finish is not None))
        return outputs

    def apply_chat_template(self, messages, chat_template=None, add_generation_prompt=True, **kwargs) -> list[int]:
        return self.tokenizer.encode("\n".join(m["content"] for m in messages))

    def get_stats(self) -> dict:
        return {"num_requests_running": len(self.requests)}


def _serve_in_thread(on_death=None):
    from test_server_helpers import serve_in_thread

    from wslm.backend.entrypoints.openai.serving_base import ServerState
    from wslm.backend.frontend.async_engine import AsyncEngine
    from wslm.backend.frontend.metrics import ServerMetrics

    engine = FlakyEngine()
    metrics = ServerMetrics("flaky")
    state = ServerState(AsyncEngine(engine, metrics), engine.tokenizer, ["flaky"], 512, metrics=metrics)
    state.engine.on_death = on_death
    return serve_in_thread(state)


@pytest.fixture(scope="module")
def url():
    address, server, thread = _serve_in_thread()
    yield address
    server.should_exit = True
    thread.join(30)


def _chat(url: str, content: str, **extra) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=30,
                      json={"model": "flaky", "messages": [{"role": "user", "content": content}], "max_tokens": 3,
                            **extra})


def _assert_still_serving(url: str) -> None:
    r = _chat(url, "hello")
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "xxx"
    assert httpx.get(url + "/health").status_code == 200


def test_engine_step_raising(url):
    r = _chat(url, "FAIL_STEP")
    assert r.status_code == 500
    error = r.json()["error"]
    assert "scheduler bug" in error["message"] and "Traceback" not in error["message"]
    assert error["type"] == "server_error"
    _assert_still_serving(url)
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIError, match="scheduler bug"):
        for _ in client.chat.completions.create(model="flaky", messages=[{"role": "user", "content": "FAIL_STEP"}],
                                                stream=True, max_tokens=3):
            pass
    _assert_still_serving(url)


def test_request_failed_by_engine(url):
    r = _chat(url, "ENGINE_ERROR")
    assert r.status_code == 500 and "boom" in r.json()["error"]["message"]
    with httpx.stream("POST", url + "/v1/completions", timeout=30,
                      json={"model": "flaky", "prompt": "ENGINE_ERROR", "stream": True}) as s:
        lines = [line for line in s.iter_lines() if line]
    assert '"error"' in lines[-2] and "boom" in lines[-2] and lines[-1] == "data: [DONE]"
    _assert_still_serving(url)


def test_handler_bug_is_a_500_with_a_message(url):
    r = httpx.post(url + "/v1/completions", json={"model": "flaky", "prompt": "BREAK_TOKENIZER"}, timeout=30)
    assert r.status_code == 500
    message = r.json()["error"]["message"]
    assert "tokenizer exploded" in message and "still running" in message and "Traceback" not in message
    _assert_still_serving(url)


def test_out_of_memory_is_a_503_naming_the_cause(url):
    r = _chat(url, "ENGINE_OOM")
    assert r.status_code == 503 and r.json()["error"]["code"] == "out_of_memory"
    assert "Out of memory" in r.json()["error"]["message"]
    _assert_still_serving(url)


def test_dead_engine_loop_turns_health_503_and_reports_the_cause():
    causes: list[str] = []
    address, server, thread = _serve_in_thread(on_death=causes.append)
    try:
        r = _chat(address, "KILL_ENGINE")
        # 503: the model is unavailable (a pooled model loads again on its next request), not a bad request
        assert r.status_code == 503 and "workers gone" in r.json()["error"]["message"]
        assert causes and "workers gone" in causes[0]  # the launcher's hook: it makes the server exit non-zero
        health = httpx.get(address + "/health", timeout=10)
        assert health.status_code == 503 and "workers gone" in health.json()["message"]
        r = _chat(address, "hello")  # no zombie: refused at once, with the cause
        assert r.status_code == 503 and "workers gone" in r.json()["error"]["message"]
    finally:
        server.should_exit = True
        thread.join(30)


def _faulty_server(tiny, faults: dict, **env: str):
    from fault_executor import BACKEND, server_env
    from test_server_helpers import ServerProcess

    return ServerProcess("--model", str(tiny), "--port", "0", "--kv-cache-memory", "8MiB", "--dtype", "float32",
                         "--enforce-eager", "--uvicorn-log-level", "warning", "--distributed-executor-backend", BACKEND,
                         env={**server_env(faults), **env})


def test_engine_death_in_process_makes_wslm_serve_exit_nonzero(tmp_path):
    """A core in the server's own process (WSLM_CORE_PROCESS=0) cannot be started again: the server exits."""
    from hub_server import make_tiny_llama

    srv = _faulty_server(make_tiny_llama(tmp_path / "tiny"), {"die_after_steps": 3}, WSLM_CORE_PROCESS="0")
    try:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi there", "max_tokens": 10}, timeout=60)
        assert r.status_code == 503 and "engine" in r.json()["error"]["message"]
        assert srv.proc.wait(60) == 1
        assert srv.wait_event(("error",), 10)["message"].startswith("The engine stopped (EngineDeadError")
    finally:
        srv.stop()


def test_engine_death_in_the_core_process_restarts_the_core(tmp_path):
    """The default model's core process dies (its workers are gone): its request gets 503 naming the cause,
    the server goes on, and the next request runs on a new core (frontend/core_restart.py)."""
    from hub_server import make_tiny_llama

    srv = _faulty_server(make_tiny_llama(tmp_path / "tiny"), {"die_after_steps": 3})
    try:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi there", "max_tokens": 10}, timeout=60)
        error = r.json()["error"]
        assert r.status_code == 503 and error["code"] == "engine_dead", error
        assert "injected fault" in error["message"] and "starts the model's core again" in error["message"], error
        # A new core counts its steps from 0: one prefill step serves a 1-token request.
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi there", "max_tokens": 1}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1, r.text
        assert srv.proc.poll() is None and httpx.get(srv.url + "/health", timeout=10).status_code == 200
    finally:
        assert srv.stop() == 0
