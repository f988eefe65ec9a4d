"""`wslm serve` as the GUI runs it: API key, served model name, the JSON status lines when start-up fails,
and a graceful SIGTERM while a stream is running."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time

import httpx
import openai
import pytest
from test_server_helpers import SMALL, ServerProcess

KEY = "sk-test-0123456789"


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--port", "0", "--served-model-name", "my-model", "--shutdown-timeout", "1", *SMALL,
                        env={"WSLM_API_KEY": KEY})
    yield srv
    srv.stop()


def test_api_key(server):
    good = openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)
    r = good.chat.completions.create(model="my-model", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert r.model == "my-model" and r.choices[0].message.role == "assistant"
    assert [m.id for m in good.models.list().data] == ["my-model"]
    with pytest.raises(openai.AuthenticationError) as exc:
        openai.OpenAI(base_url=server.base_url, api_key="sk-wrong", max_retries=0).models.list()
    assert exc.value.status_code == 401 and "Incorrect API key" in exc.value.message
    for headers in ({}, {"Authorization": KEY}, {"Authorization": "Bearer " + KEY[:-1]}):
        r = httpx.post(server.base_url + "/chat/completions", headers=headers,
                       json={"model": "my-model", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(server.url + "/health").status_code == 200  # open for the GUI's health check


def test_served_model_name(server):
    assert server.ready["model"] == "my-model"
    client = openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError, match="my-model"):
        client.completions.create(model="other", prompt="hi", max_tokens=2)


def _start_failure(*args: str) -> tuple[int, list[dict]]:
    srv = ServerProcess(*args, wait=False)
    event = srv.wait_event(("ready", "error"), 120)
    code = srv.proc.wait(60)
    assert event["event"] == "error", event
    lines = [json.loads(line) for line in srv.stdout_lines]  # nothing but JSON on stdout
    return code, lines


def test_port_in_use():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, lines = _start_failure("--port", str(port))
    assert code != 0 and [e["event"] for e in lines] == ["loading", "error"]
    message = lines[-1]["message"]
    assert f"Port {port}" in message and "already in use" in message and "--port" in message


def test_missing_model_and_bad_flags(tmp_path):
    missing = str(tmp_path / "nothing-here.gguf")
    code, lines = _start_failure("--port", "0", "--model", missing)
    assert code != 0 and lines[-1]["event"] == "error" and "nothing-here" in lines[-1]["message"]
    code, lines = _start_failure("--port", "0", "--tensor-parallel-size", "2")
    # The demo model has 9 heads: 2 ranks cannot split it, 3 can.
    assert code != 0 and "--tensor-parallel-size 1 or 3" in lines[-1]["message"]
    code, lines = _start_failure("--port", "0", "--kv-cache-memory", "lots")
    assert code != 0 and "--kv-cache-memory" in lines[-1]["message"]


def test_sigterm_ends_streams_cleanly(server):
    # Last test of the module: it stops the server.
    body = {"model": "my-model", "messages": [{"role": "user", "content": "Tell me a long story."}],
            "stream": True, "max_tokens": 900, "ignore_eos": True, "stream_options": {"include_usage": True}}
    events = []
    started = threading.Event()

    def read() -> None:
        with httpx.stream("POST", server.base_url + "/chat/completions", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {KEY}"}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if len(events) >= 4:
                        started.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert started.wait(60)
    t0 = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    reader.join(60)
    assert server.proc.wait(60) == 0, server.stderr()[-3000:]
    assert time.monotonic() - t0 < 30
    assert events[-1] == "[DONE]"
    usage = json.loads(events[-2])
    assert usage["choices"] == [] and 0 < usage["usage"]["completion_tokens"] < 900
    finishes = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-2]]
    assert finishes.count(None) == len(finishes) - 1 and finishes[-1] == "abort"
    assert all(json.loads(line)["event"] in ("loading", "load_progress", "ready") for line in server.stdout_lines)
