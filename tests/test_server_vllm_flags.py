"""A vLLM launch script runs unchanged: `wslm serve` takes vLLM's common flags, each doing what vLLM's does
(or, where it cannot apply, logged as having no effect), on one real server process over a tiny model
found in a HF cache folder by repo id and revision. An unknown flag is still an error."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading

import httpx
import openai
import pytest
from test_server_helpers import REPO, ServerProcess

KEY = "sk-flags-test"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    # A HF cache holding "test/tiny" at a commit that the branch "main" points to (--download-dir, --revision).
    cache = tmp_path_factory.mktemp("hfcache")
    repo = cache / "models--test--tiny"
    snapshot = repo / "snapshots" / COMMIT
    shutil.copytree(tiny_models["qwen2"], snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    # The model creator's defaults: greedy, 5 new tokens (--generation-config auto reads them).
    (snapshot / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "max_new_tokens": 5}))
    srv = ServerProcess(
        "test/tiny", "--port", "0", "--download-dir", str(cache), "--revision", "main",
        "--tokenizer", str(snapshot), "--trust-remote-code", "--enforce-eager", "--seed", "3",
        "--max-logprobs", "3", "--enable-log-requests", "--uvicorn-log-level", "warning",
        "--swap-space", "4", "--disable-log-stats", "--root-path", "/llm", "--enable-prompt-tokens-details",
        "--enable-force-include-usage", "--enable-server-load-tracking", "--enable-tokenizer-info-endpoint",
        "--enable-per-request-metrics", "--generation-config", "auto", "--kv-cache-memory", "32MiB", "--max-model-len", "256", "-pp", "1",
        env={"WSLM_API_KEY": KEY},
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/llm/v1", api_key=KEY, max_retries=0)


AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"messages": [{"role": "user", "content": "Hello there"}]}


def test_no_effect_flags_are_logged_once(server):
    log = server.stderr()
    assert log.count("--swap-space 4 has no effect") == 1
    assert log.count("--disable-log-stats has no effect") == 1
    assert "Default sampling parameters from the model's generation config" in log


def test_generation_config_defaults_and_request_logging(server, client):
    r = client.chat.completions.create(model="test/tiny", **CHAT)
    assert r.usage.completion_tokens <= 5 and (r.choices[0].finish_reason != "length" or r.usage.completion_tokens == 5)
    again = client.chat.completions.create(model="test/tiny", **CHAT)
    assert again.choices[0].message.content == r.choices[0].message.content  # temperature 0 from the config
    # A request's own value wins over the model's default.
    longer = client.chat.completions.create(model="test/tiny", max_tokens=7, temperature=0, **CHAT)
    assert longer.usage.completion_tokens == 7 or longer.choices[0].finish_reason == "stop"
    assert "Received request chatcmpl-" in server.stderr()


def test_max_logprobs_and_prompt_tokens_details(client):
    r = client.chat.completions.create(model="test/tiny", logprobs=True, top_logprobs=3, max_tokens=2, **CHAT)
    assert len(r.choices[0].logprobs.content[0].top_logprobs) == 3
    long_chat = [{"role": "user", "content": "Tell me a story about a cat who lived in a lighthouse " * 4}]
    first, second = (client.chat.completions.create(model="test/tiny", messages=long_chat, max_tokens=1)
                     for _ in range(2))
    assert second.usage.prompt_tokens_details.cached_tokens >= 16  # the same prompt again: prefix cache hit
    with pytest.raises(openai.BadRequestError, match="--max-logprobs"):
        client.chat.completions.create(model="test/tiny", logprobs=True, top_logprobs=4, max_tokens=2, **CHAT)
    with pytest.raises(openai.BadRequestError, match="--max-logprobs"):
        client.completions.create(model="test/tiny", prompt="Hi", logprobs=4, max_tokens=2)


def test_force_include_usage_on_streams(client):
    chunks = list(client.chat.completions.create(model="test/tiny", max_tokens=3, stream=True, **CHAT))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3 and not chunks[-1].choices


METRIC_FIELDS = {"time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms", "tokens_per_second"}


def test_per_request_metrics(client):
    """vLLM's --enable-per-request-metrics: a `metrics` object on one-stream answers, on the usage chunk of a
    stream, null when n > 1 (the times would describe one of the n streams only)."""
    r = client.chat.completions.create(model="test/tiny", max_tokens=4, temperature=0,
                                       extra_body={"ignore_eos": True}, **CHAT)
    m = r.model_extra["metrics"]
    assert set(m) == METRIC_FIELDS
    assert m["time_to_first_token_ms"] > 0 and m["queue_time_ms"] >= 0 and m["generation_time_ms"] >= 0
    assert m["tokens_per_second"] > 0 and m["mean_itl_ms"] is not None
    assert m["time_to_first_token_ms"] + m["generation_time_ms"] <= 4 / m["tokens_per_second"] * 1000 + 1
    one = client.completions.create(model="test/tiny", prompt="Hi", max_tokens=1)
    assert one.model_extra["metrics"]["mean_itl_ms"] is None  # one token: no inter-token gap
    many = client.chat.completions.create(model="test/tiny", max_tokens=2, n=2, **CHAT)
    assert many.model_extra["metrics"] is None
    chunks = list(client.chat.completions.create(model="test/tiny", max_tokens=3, stream=True, **CHAT))
    assert set(chunks[-1].model_extra["metrics"]) == METRIC_FIELDS
    assert all("metrics" not in c.model_extra for c in chunks[:-1])


def test_load_counts_requests_in_flight(server):
    base = server.url
    assert httpx.get(base + "/load").json() == {"server_load": 0}
    body = {**CHAT, "max_tokens": 60, "n": 8, "ignore_eos": True}  # keeps the tiny model busy a while
    answers = []
    worker = threading.Thread(target=lambda: answers.append(
        httpx.post(base + "/v1/chat/completions", json=body, headers=AUTH, timeout=120)))
    worker.start()
    seen = set()
    while worker.is_alive():
        seen.add(httpx.get(base + "/load").json()["server_load"])
    worker.join()
    assert answers[0].status_code == 200, answers[0].text
    assert 1 in seen and seen <= {0, 1}
    assert httpx.get(base + "/load").json() == {"server_load": 0}


def test_tokenizer_info(server):
    info = httpx.get(server.url + "/tokenizer_info").json()
    assert info["tokenizer_class"].endswith("Tokenizer") or info["tokenizer_class"].endswith("TokenizerFast")
    assert "chat_template" in info and "vocab_file" not in info


def test_invocations_and_root_path(server):
    base = server.url
    chat = httpx.post(base + "/invocations", json={**CHAT, "max_tokens": 2}, headers=AUTH)
    assert chat.status_code == 200 and chat.json()["object"] == "chat.completion"
    completion = httpx.post(base + "/llm/invocations", json={"prompt": "Hi", "max_tokens": 2}, headers=AUTH)
    assert completion.status_code == 200 and completion.json()["object"] == "text_completion"
    neither = httpx.post(base + "/invocations", json={"max_tokens": 2}, headers=AUTH)
    assert neither.status_code == 400 and "messages" in neither.json()["error"]["message"]
    # Routes answer with and without the prefix; the key guards both, and /invocations too.
    assert httpx.get(base + "/llm/v1/models").status_code == 401
    assert httpx.get(base + "/llm/v1/models", headers=AUTH).status_code == 200
    assert httpx.get(base + "/v1/models", headers=AUTH).status_code == 200
    assert httpx.post(base + "/invocations", json=CHAT).status_code == 401
    # A text model serves no embeddings, and says so.
    card = httpx.get(base + "/v1/models", headers=AUTH).json()["data"][0]
    assert card["task"] == "generate" and "chat" in card["capabilities"]
    no = httpx.post(base + "/invocations", json={"input": "hi"}, headers=AUTH)
    assert no.status_code == 400 and no.json()["error"]["code"] == "model_not_supported"


def test_unknown_flag_is_still_an_error():
    proc = subprocess.run([sys.executable, "-m", "wslm", "serve", "--swap-space", "4", "--no-such-flag"],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 2 and "unrecognized arguments: --no-such-flag" in proc.stderr
    # A flag it knows but cannot honour is a clear start-up error, before any model loads.
    proc = subprocess.run([sys.executable, "-m", "wslm", "serve", "--pipeline-parallel-size", "2"],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    event = json.loads(proc.stdout.splitlines()[-1])
    assert proc.returncode == 1 and event["event"] == "error" and "--tensor-parallel-size" in event["message"]
