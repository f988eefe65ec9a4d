"""More of `vllm serve`'s launch-script flags (issue 26): HTTPS with --ssl-keyfile/--ssl-certfile, a YAML
--config under the command line, --hf-token kept out of the log, --response-role, the structured-output
backend flags, flags that cannot apply refused in one line; the utility endpoints under --api-key beyond
loopback; /v1/messages with a forced tool call cut by max_tokens; the CPU compile started once the server is
ready. One real `wslm serve` over TLS on a tiny random Llama."""

from __future__ import annotations

import json
import logging
import re
import ssl
import subprocess
import time
from pathlib import Path

import httpx
import openai
import pytest
from hub_server import make_tiny_llama
from test_server_helpers import ServerProcess

from wslm.backend.entrypoints.openai.serving_messages import partial_json_object

KEY = "sk-more-flags"
TOKEN = "hf_secretTokenNeverLogged123"
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
AUTH = {"Authorization": f"Bearer {KEY}"}
TOOL = {"name": "get_weather", "description": "weather for a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-flags-more"))


@pytest.fixture(scope="module")
def cert(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, and its key."""
    folder = tmp_path_factory.mktemp("tls")
    key, crt = folder / "key.pem", folder / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out", str(crt),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    return key, crt


@pytest.fixture(scope="module")
def server(tiny, cert, tmp_path_factory):
    config = tmp_path_factory.mktemp("cfg") / "serve.yaml"
    # The file's flags apply unless the command line gives them (max_model_len: the command line's 128 wins).
    config.write_text(f"model: {tiny}\nmax_model_len: 200\nkv-cache-memory: 8MiB\ndtype: float32\n"
                      "served_model_name: [tiny-cfg]\nenable_server_load_tracking: true\n"
                      f"chat_template: {json.dumps(TEMPLATE)}\n")
    key, crt = cert
    srv = ServerProcess("--config", str(config), "--max_model_len", "128", "--host", "0.0.0.0", "--port", "0",
                        "--ssl-keyfile", str(key), "--ssl-certfile", str(crt), "--api-key", KEY,
                        "--response-role", "bot", "--guided-decoding-backend", "xgrammar", "--hf-token", TOKEN,
                        "--cpu-offload-gb", "0", "--no-enable-lora", "--max-log-len", "100",
                        "--uvicorn-log-level", "warning", env={"WSLM_CPU_COMPILE": "1"})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def base(server) -> str:
    return f"https://127.0.0.1:{server.ready['port']}"


@pytest.fixture(scope="module")
def http(cert):
    with httpx.Client(verify=ssl.create_default_context(cafile=str(cert[1])), timeout=60) as client:
        yield client


def test_https_with_the_openai_client_and_the_response_role(server, base, http):
    assert server.ready["url"].startswith("https://") and server.ready["max_model_len"] == 128
    client = openai.OpenAI(base_url=base + "/v1", api_key=KEY, http_client=http, max_retries=0)
    assert [m.id for m in client.models.list().data] == ["tiny-cfg"]  # served_model_name from the file
    reply = client.chat.completions.create(model="tiny-cfg", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=3)
    assert reply.choices[0].message.role == "bot" and reply.usage.completion_tokens >= 1
    chunks = list(client.chat.completions.create(model="tiny-cfg", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=3, stream=True))
    assert chunks[0].choices[0].delta.role == "bot"
    # Plain HTTP to the TLS port is not served.
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{server.ready['port']}/health", timeout=10)
    log = server.stderr()
    assert TOKEN not in log and TOKEN not in "".join(server.stdout_lines)
    assert log.count("--max-log-len 100 has no effect") == 1


def test_utility_endpoints_need_the_key_beyond_loopback(base, http):
    for method, path, body in (("POST", "/tokenize", {"prompt": "hi"}), ("POST", "/detokenize", {"tokens": [5]}),
                               ("GET", "/metrics", None), ("GET", "/load", None), ("GET", "/docs", None),
                               ("GET", "/openapi.json", None)):
        refused = http.request(method, base + path, json=body)
        assert refused.status_code == 401, (path, refused.text)
        served = http.request(method, base + path, json=body, headers=AUTH)
        assert served.status_code == 200, (path, served.text)
    assert http.get(base + "/health").status_code == 200 and http.get(base + "/version").status_code == 200


def test_messages_tool_call_cut_by_max_tokens_keeps_what_was_generated(base, http):
    body = {"model": "tiny-cfg", "max_tokens": 7, "temperature": 0, "tools": [TOOL],
            "messages": [{"role": "user", "content": "weather in Paris?"}],
            "tool_choice": {"type": "tool", "name": "get_weather"}}
    answer = http.post(base + "/v1/messages", json=body, headers=AUTH).json()
    assert answer["stop_reason"] == "max_tokens" and answer["usage"]["output_tokens"] == 7, answer
    (block,) = [b for b in answer["content"] if b["type"] == "tool_use"]
    assert block["name"] == "get_weather" and isinstance(block["input"], dict)
    assert set(block["input"]) <= {"city"} and all(isinstance(v, str) for v in block["input"].values())
    # Streamed, the same call's raw partial JSON; the whole reply's input is what of it parses.
    events = [json.loads(line[6:]) for line in http.post(base + "/v1/messages", json={**body, "stream": True},
                                                          headers=AUTH).text.splitlines()
              if line.startswith("data: ")]
    partial = "".join(e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta"
                      and e["delta"]["type"] == "input_json_delta")
    assert partial and block["input"] == partial_json_object(partial)
    assert [e["delta"]["stop_reason"] for e in events if e["type"] == "message_delta"] == ["max_tokens"]


def test_partial_json_object():
    assert partial_json_object('{"city": "Par') == {"city": "Par"}
    assert partial_json_object('{"city": "Paris", "uni') == {"city": "Paris"}
    assert partial_json_object('{"a": [1, {"b": tr') == {"a": [1, {}]}
    assert partial_json_object('{"q": "say \\"hi') == {"q": 'say "hi'}
    assert partial_json_object("") == {} and partial_json_object("[1, 2") == {}


def _serve_parser():
    import argparse

    from wslm.backend.entrypoints.cli import serve as serve_cli

    subparsers = argparse.ArgumentParser().add_subparsers()
    serve_cli.register(subparsers)
    return subparsers.choices["serve"]


def test_flags_that_cannot_apply_are_one_line_errors(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_model_len: 64\nno_such_flag: 1\n")
    for argv, words in ((["--qlora-adapter-name-or-path", "x"], "--qlora-adapter-name-or-path is not supported"),
                        (["--cpu-offload-gb", "4"], "--cpu-offload-gb is not supported"),
                        (["--guided-decoding-backend", "outlines"], "xgrammar"),
                        (["--structured-outputs-config.backend", "guidance"], "xgrammar"),
                        (["--config", str(bad)], "`no_such_flag` is not a flag")):
        with pytest.raises(SystemExit) as exit_:
            _serve_parser().parse_args(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and words in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(SystemExit):
        _serve_parser().parse_args(["--max-model", "4"])  # still no abbreviations
    assert "unrecognized arguments: --max-model" in capsys.readouterr().err
    # Harmless values pass; underscores are dashes; the command line wins over --config.
    good = tmp_path / "good.yaml"
    good.write_text("max_num_seqs: 3\nseed: 5\nenable-prefix-caching: false\nstructured_outputs_config: {backend: auto}\n")
    args = _serve_parser().parse_args(["--config", str(good), "--seed=9", "--cpu_offload_gb", "0", "--no-enable-lora"])
    assert (args.max_num_seqs, args.seed, args.enable_prefix_caching, args.structured_outputs_backend) == (3, 9, False,
                                                                                                           "auto")


def test_bad_tls_files_are_startup_errors(tmp_path):
    from argparse import Namespace

    from wslm.backend.entrypoints.openai.launcher import StartupError, check_ssl_flags

    with pytest.raises(StartupError, match="--ssl-certfile"):
        check_ssl_flags(Namespace(ssl_keyfile=str(tmp_path / "key.pem"), ssl_certfile=None))
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(StartupError, match="PEM"):
        check_ssl_flags(Namespace(ssl_keyfile=str(tmp_path / "junk.pem"), ssl_certfile=str(tmp_path / "junk.pem"),
                                  ssl_ca_certs=None))


def test_cpu_compile_starts_when_the_server_is_ready(server):
    # The server runs with WSLM_CPU_COMPILE=1: the batch graph's compile starts once it is ready, before
    # any concurrent batch (the tests above send one request at a time).
    deadline = time.monotonic() + 30
    while "CPU decode compile started" not in server.stderr():
        assert time.monotonic() < deadline, server.stderr()[-3000:]
        time.sleep(0.2)
    log = server.stderr()
    assert log.index("wslm serving") < log.index("CPU decode compile started")


def test_compile_logs_its_end_with_seconds(tiny, monkeypatch, caplog):
    import threading

    import torch

    from wslm.backend import LLM

    monkeypatch.setenv("WSLM_CPU_COMPILE", "1")
    monkeypatch.setattr(torch, "compile", lambda module, **kw: module)  # the bookkeeping, not inductor
    llm = LLM(str(tiny), dtype="float32", kv_cache_memory=8 << 20, max_model_len=128)
    compiled = llm.llm_engine.executor.runner.compiled
    assert compiled is not None and compiled._thread is None  # nothing before it is asked for
    caplog.set_level(logging.INFO, logger="wslm.backend.platforms.cpu.decode_compiled")
    askers = [threading.Thread(target=llm.llm_engine.start_background_compile) for _ in range(3)]
    for t in askers:
        t.start()
    for t in askers:
        t.join()
    assert compiled.wait(timeout=120), compiled.failed
    lines = [r.getMessage() for r in caplog.records]
    assert sum("CPU decode compile started" in m for m in lines) == 1  # once, however many ask
    assert any(re.search(r"CPU decode compile ended in \d+\.\d s", m) for m in lines), lines
