"""Edges of the HTTP server (issue 26): request-head limits that hold however TCP cuts the bytes (431),
slow or silent connections timed out (slowloris), unknown chat roles refused, no U+FFFD from a reply cut
inside a character, and torch's compiler noise kept out of the log. A real `wslm serve` process on a tiny
random Llama, on loopback."""

from __future__ import annotations

import io
import json
import logging
import socket
import time
from pathlib import Path

import httpx
import pytest
from hub_server import make_tiny_llama
from test_server_helpers import ServerProcess

TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
HEAD_TIMEOUT = 1.5
FLAGS = ["--kv-cache-memory", "8MiB", "--dtype", "float32", "--uvicorn-log-level", "warning",
         "--chat-template", TEMPLATE, "--request-head-timeout", str(HEAD_TIMEOUT)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-edges"))


@pytest.fixture(scope="module")
def server(tiny):
    srv = ServerProcess("--model", str(tiny), "--port", "0", *FLAGS)
    yield srv
    srv.stop()


def _address(server) -> tuple[str, int]:
    return "127.0.0.1", int(server.ready["port"])


def _chat(server, messages=None, **extra) -> httpx.Response:
    body = {"messages": messages or [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)


def _raw_request(server, head: bytes, piece: int | None = None) -> int:
    """Send a raw request head (all at once, or `piece` bytes per send); the status code answered."""
    with socket.create_connection(_address(server), timeout=30) as s:
        try:
            if piece is None:
                s.sendall(head)
            else:
                for i in range(0, len(head), piece):
                    s.sendall(head[i : i + piece])
                    time.sleep(0.002)  # separate reads on the server
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused part-way: the answer is already waiting
        answer = b""
        while b"\r\n" not in answer:
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer.split()[1])


def _head(n_headers: int, value: bytes = b"v") -> bytes:
    lines = [b"GET /health HTTP/1.1", b"Host: 127.0.0.1"]
    lines += [b"X-Filler-%05d: %s" % (i, value) for i in range(n_headers)]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def test_header_limits_hold_however_the_bytes_arrive(server):
    flood = _head(10_000)  # ~200 KB
    assert len(flood) > 100_000
    assert _raw_request(server, flood) == 431  # one burst
    assert _raw_request(server, flood, piece=4096) == 431  # the same bytes in 4 KB pieces
    assert _raw_request(server, _head(150), piece=512) == 431  # too many headers, though only ~3 KB
    assert _raw_request(server, _head(150)) == 431
    assert _raw_request(server, _head(1, b"x" * 20_000)) == 431  # one huge header
    assert _raw_request(server, _head(1, b"x" * 20_000), piece=1024) == 431
    assert _raw_request(server, _head(90)) == 200  # within both limits
    assert _raw_request(server, _head(90), piece=64) == 200
    # Through an HTTP client: the 431 is an error in OpenAI's shape.
    r = httpx.get(server.url + "/health", headers={f"x-h{i}": "v" for i in range(120)}, timeout=30)
    assert r.status_code == 431 and r.json()["error"]["code"] == "request_header_fields_too_large"
    assert "--max-header-count" in r.json()["error"]["message"]
    assert _chat(server).status_code == 200


def test_header_limit_flags(tiny):
    srv = ServerProcess("--model", str(tiny), "--port", "0", *FLAGS, "--max-header-count", "300",
                        "--max-header-bytes", "65536")
    try:
        assert _raw_request(srv, _head(200)) == 200
        assert _raw_request(srv, _head(200), piece=1024) == 200
        assert _raw_request(srv, _head(400)) == 431
        assert _raw_request(srv, _head(1, b"x" * 70_000), piece=4096) == 431
    finally:
        srv.stop()
    for flag, value in (("--max-header-count", "0"), ("--max-header-bytes", "-1"), ("--request-head-timeout", "0")):
        bad = ServerProcess("--model", str(tiny), "--port", "0", *FLAGS, flag, value, wait=False)
        try:
            event = bad.wait_event(("ready", "error"), 120)
            assert event["event"] == "error" and flag in event["message"], event
        finally:
            bad.stop()


def test_silent_and_slow_connections_are_timed_out(server):
    idle = [socket.create_connection(_address(server), timeout=30) for _ in range(3)]
    slow = socket.create_connection(_address(server), timeout=30)
    slow.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # ...and the rest never comes
    try:
        assert _chat(server).status_code == 200  # served while those connections wait
        start = time.monotonic()
        for s in idle:
            assert s.recv(1024) == b""  # closed, without an answer: nothing was asked
        answer = slow.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert "--request-head-timeout" in json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["message"]
        assert time.monotonic() - start < HEAD_TIMEOUT + 5
    finally:
        for s in [*idle, slow]:
            s.close()
    # Keep-alive: after a response, a connection that starts a head must finish it in time too.
    with socket.create_connection(_address(server), timeout=30) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
        s.sendall(b"G")
        assert s.recv(65536).startswith(b"HTTP/1.1 408 ")
    assert _chat(server).status_code == 200


def test_custom_chat_role_reaches_the_template(server):
    """vLLM passes any role to the chat template (its test_custom_role): the demo's ChatML template renders
    `<|im_start|>wizard`. Only a role that is no name at all is a 400 naming messages.N.role."""
    r = _chat(server, [{"role": "user", "content": "hi"}, {"role": "wizard", "content": "abracadabra"}])
    assert r.status_code == 200, r.text
    r = httpx.post(server.url + "/tokenize", json={"messages": [{"role": "wizard", "content": "x"}],
                                                  "return_token_strs": True}, timeout=30)
    assert r.status_code == 200 and "wizard" in "".join(r.json()["token_strs"]), r.text
    for role in ("system", "developer", "user"):
        assert _chat(server, [{"role": role, "content": "hi"}]).status_code == 200, role
    for bad in ("", " user", "a" * 65, "us\ner"):
        r = _chat(server, [{"role": "user", "content": "hi"}, {"role": bad, "content": "x"}])
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["param"] == "messages.1.role", r.text


def test_template_refusal_is_a_400_in_its_own_words(server):
    template = ("{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}"
                "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}"
                "{{ m.content }}{% endfor %}")
    r = _chat(server, [{"role": "wizard", "content": "x"}], chat_template=template)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages" and "Only user and assistant roles are supported!" in error["message"]
    assert _chat(server, [{"role": "user", "content": "x"}], chat_template=template).status_code == 200


def test_bad_logit_bias_and_token_ids_are_all_named(server):
    r = _chat(server, logit_bias={"abc": 1, "5": 2, "xyz": 3})
    assert r.status_code == 400 and "'abc'" in r.text and "'xyz'" in r.text, r.text
    r = _chat(server, logit_bias={"99999999": 1, "5": 2, "88888888": 3})
    assert r.status_code == 400, r.text
    assert "99999999" in r.text and "88888888" in r.text and r.json()["error"]["param"] == "logit_bias"


def test_reply_cut_inside_a_character_has_no_replacement_char(server, tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    ids = tok.encode("🎉", add_special_tokens=False)  # byte-level BPE: F0 9F 8E 89, one token each
    assert len(ids) == 4 and tok.decode(ids) == "🎉" and tok.decode(ids[:1]) == "\ufffd"
    for forced, max_tokens in ((ids[:1], 1), (ids[:2], 2)):
        body = {"prompt": "hi", "max_tokens": max_tokens, "allowed_token_ids": forced, "temperature": 0,
                "return_token_ids": True, "ignore_eos": True}
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
        choice = r["choices"][0]
        assert "\ufffd" not in choice["text"] and choice["finish_reason"] == "length", r
        assert len(choice["token_ids"]) == max_tokens  # the ids still carry the cut character
        with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as s:
            events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
        assert events and all("\ufffd" not in c["text"] for e in events for c in e["choices"])
        chat = _chat(server, max_tokens=max_tokens, allowed_token_ids=forced, ignore_eos=True).json()
        assert "\ufffd" not in (chat["choices"][0]["message"]["content"] or ""), chat


def test_compiler_noise_stays_at_debug_level():
    import torch  # noqa: F401 - installs torch's log handlers (its compiler loggers do not propagate)

    from wslm.backend.entrypoints.openai import launcher

    inductor = logging.getLogger("torch._inductor")
    stream = io.StringIO()
    streams = [(h, h.setStream(stream)) for h in inductor.handlers  # torch's own (pytest's are on root too)
               if isinstance(h, logging.StreamHandler) and h not in logging.getLogger().handlers]
    assert streams, "torch installed no handler on torch._inductor"
    seen: list[logging.LogRecord] = []
    probe = logging.Handler()
    probe.emit = seen.append  # type: ignore[method-assign]
    server_log = logging.getLogger("wslm.server")
    server_log.addHandler(probe)
    level = server_log.level
    server_log.setLevel(logging.INFO)
    noise = launcher.quiet_compiler_logs(debug=False)
    try:
        for _ in range(50):
            logging.getLogger("torch._inductor.select_algorithm").error("Runtime error during autotuning: \n"
                                                                       "C++ compile error\n\nCommand: g++ ...")
        logging.getLogger("torch._dynamo.convert_frame").warning("recompile limit reached")
        assert stream.getvalue() == ""
        told = [r for r in seen if "torch's compiler reported errors" in r.getMessage()]
        assert len(told) == 1 and told[0].levelno == logging.INFO
        noise.debug = True  # --uvicorn-log-level debug: shown, as debug lines
        logging.getLogger("torch._inductor.select_algorithm").error("C++ compile error (debug)")
        assert "C++ compile error (debug)" in stream.getvalue()
    finally:
        server_log.removeHandler(probe)
        server_log.setLevel(level)
        for logger in [logging.getLogger(), *(logging.getLogger(n) for n in list(logging.root.manager.loggerDict))]:
            for handler in getattr(logger, "handlers", []):
                handler.removeFilter(noise)
        for handler, old in streams:
            handler.setStream(old)
