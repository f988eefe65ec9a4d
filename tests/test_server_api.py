"""`wslm serve` on the demo model, driven with the official openai client and raw httpx: one server for the
whole module. Covers the endpoints, streaming shape, n, stop, seed, usage, errors, concurrency, disconnect."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
from test_server_helpers import SMALL, ServerProcess, metric

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
HELLO = [SYSTEM, {"role": "user", "content": "Write one sentence about the sea."}]


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--port", "0", *SMALL)
    yield srv
    assert srv.stop() == 0, srv.stderr()[-3000:]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def sse_events(response: httpx.Response) -> list:
    """The data payloads of an SSE response, [DONE] kept as the string."""
    out = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
        else:
            assert line == "", f"not SSE: {line!r}"
    return out


def test_ready_line_models_health_version(server, client):
    ready = server.ready
    assert ready["host"] == "127.0.0.1" and ready["port"] > 0 and ready["model"] == "demo"
    assert ready["url"] == f"http://127.0.0.1:{ready['port']}" and ready["pid"] == server.proc.pid
    assert server.events[0] == {"event": "loading", "model": "demo", "pid": server.proc.pid}
    models = client.models.list()
    assert [m.id for m in models.data] == ["demo"]
    assert models.data[0].object == "model" and models.data[0].max_model_len == 1024
    assert client.models.retrieve("demo").id == "demo"
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/version").json()["version"]


def test_seed_snippet_streaming(client):
    # The seed user's own snippet: system + user, stream=True, printing the deltas.
    stream = client.chat.completions.create(model="demo", messages=HELLO, stream=True, max_tokens=16)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert text.strip()
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0] is chunks[-1]
    assert finals[0].choices[0].finish_reason in ("stop", "length")
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


def test_raw_sse_shape(server):
    body = {"model": "demo", "messages": HELLO, "stream": True, "max_tokens": 6, "temperature": 0,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.base_url + "/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 6
    assert all(e["usage"] is None for e in events[:-2])  # as OpenAI: null usage on the other chunks
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [e["choices"][0]["finish_reason"] for e in events[:-2]].count("length") == 1


def test_stream_equals_nonstream_greedy(client):
    kwargs = dict(model="demo", messages=HELLO, max_tokens=20, temperature=0)
    whole = client.chat.completions.create(**kwargs)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**kwargs, stream=True)
                       if c.choices)
    assert streamed == whole.choices[0].message.content
    assert whole.choices[0].message.role == "assistant" and whole.object == "chat.completion"
    prompt = "The capital of France is"
    whole = client.completions.create(model="demo", prompt=prompt, max_tokens=12, temperature=0)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="demo", prompt=prompt, max_tokens=12, temperature=0, stream=True))
    assert streamed == whole.choices[0].text and whole.object == "text_completion"


def test_multi_turn_and_exact_usage(server, client):
    messages = [SYSTEM, {"role": "user", "content": "My name is Ada."},
                {"role": "assistant", "content": "Nice to meet you, Ada."},
                {"role": "user", "content": [{"type": "text", "text": "What is my name?"}]}]
    r = client.chat.completions.create(model="demo", messages=messages, max_tokens=12, temperature=0,
                                       logprobs=True)
    counted = httpx.post(server.url + "/tokenize", json={"model": "demo", "messages": messages}).json()["count"]
    assert r.usage.prompt_tokens == counted
    assert r.usage.completion_tokens == len(r.choices[0].logprobs.content) <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    if r.choices[0].finish_reason == "length":
        assert r.usage.completion_tokens == 12
    # The streamed usage chunk counts the same.
    chunks = list(client.chat.completions.create(model="demo", messages=messages, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    last = chunks[-1]
    assert last.choices == [] and (last.usage.prompt_tokens, last.usage.completion_tokens) == (
        r.usage.prompt_tokens, r.usage.completion_tokens)
    assert last.usage.prompt_tokens_details is None  # as vLLM: only with --enable-prompt-tokens-details


def test_n2(client):
    r = client.chat.completions.create(model="demo", messages=HELLO, max_tokens=8, n=2, seed=3)
    assert [c.index for c in r.choices] == [0, 1]
    assert all(c.message.content for c in r.choices)
    assert r.usage.completion_tokens <= 16
    finishes: dict[int, int] = {}
    roles = set()
    for c in client.chat.completions.create(model="demo", messages=HELLO, max_tokens=8, n=2, stream=True):
        for ch in c.choices:
            if ch.delta.role:
                roles.add(ch.index)
            if ch.finish_reason:
                finishes[ch.index] = finishes.get(ch.index, 0) + 1
    assert roles == {0, 1} and finishes == {0: 1, 1: 1}


def test_stop(client):
    base = client.completions.create(model="demo", prompt="One, two, three, four,", max_tokens=16, temperature=0)
    text = base.choices[0].text
    words = [w for w in text.split() if len(w.strip(",. ")) >= 2]
    assert words, text
    stop = words[min(1, len(words) - 1)]
    r = client.completions.create(model="demo", prompt="One, two, three, four,", max_tokens=16, temperature=0,
                                  stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == text[: text.index(stop)]
    assert stop not in r.choices[0].text


def test_seed(client):
    def sample(seed: int) -> str:
        return client.chat.completions.create(model="demo", messages=HELLO, max_tokens=10, temperature=1.0,
                                              seed=seed).choices[0].message.content

    first = sample(1234)
    assert sample(1234) == first
    assert len({first, sample(1), sample(2)}) > 1


def test_sampling_extras_and_max_completion_tokens(client):
    r = client.chat.completions.create(model="demo", messages=HELLO, max_completion_tokens=5, user="ada",
                                       presence_penalty=0.5, frequency_penalty=0.5,
                                       extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1,
                                                   "min_tokens": 5})
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"
    r = client.completions.create(model="demo", prompt="Hi", max_tokens=4, temperature=0,
                                  extra_body={"ignore_eos": True, "stop_token_ids": []})
    assert r.usage.completion_tokens == 4


def test_completion_prompt_forms_echo_logprobs(server, client):
    ids = httpx.post(server.url + "/tokenize", json={"prompt": "Hello there"}).json()["tokens"]
    assert httpx.post(server.url + "/detokenize", json={"tokens": ids}).json()["prompt"] == "Hello there"
    r = client.completions.create(model="demo", prompt=["Hello there", "The sky is"], max_tokens=4, temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    by_ids = client.completions.create(model="demo", prompt=ids, max_tokens=4, temperature=0)
    assert by_ids.choices[0].text == r.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)
    batch = client.completions.create(model="demo", prompt=[ids, ids], max_tokens=4, temperature=0, n=2)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert batch.usage.prompt_tokens == 2 * len(ids) and batch.usage.completion_tokens == 16
    echo = client.completions.create(model="demo", prompt="Hello there", max_tokens=4, temperature=0, echo=True)
    assert echo.choices[0].text == "Hello there" + r.choices[0].text
    lp = client.completions.create(model="demo", prompt="Hello there", max_tokens=4, temperature=0, logprobs=2)
    info = lp.choices[0].logprobs
    assert len(info.tokens) == len(info.token_logprobs) == len(info.top_logprobs) == 4
    assert "".join(info.tokens) == lp.choices[0].text and info.text_offset[0] == 0
    assert all(len(t) >= 2 for t in info.top_logprobs) and all(v <= 0 for v in info.token_logprobs)
    chat = client.chat.completions.create(model="demo", messages=HELLO, max_tokens=4, temperature=0,
                                          logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(e.top_logprobs) == 3 for e in content)
    assert content[0].top_logprobs[0].logprob >= content[0].top_logprobs[1].logprob


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"]
    return body["error"]


def test_errors(server, client):
    chat = server.base_url + "/chat/completions"
    msgs = [{"role": "user", "content": "hi"}]
    assert "JSON" in _error(httpx.post(chat, content=b'{"model": "demo", "messages": [', timeout=30), 400)["message"]
    assert _error(httpx.post(chat, json={"model": "demo", "messages": "hi"}), 400)["param"] == "messages"
    for field, value in [("temperature", -1), ("top_p", 2), ("n", 0), ("max_tokens", 0), ("presence_penalty", 5),
                         ("max_tokens", "many"), ("top_logprobs", 3)]:
        err = _error(httpx.post(chat, json={"model": "demo", "messages": msgs, field: value}), 400)
        assert field in err["message"] or err["param"] == field, (field, err)
    long_prompt = "hello " * 1100
    err = _error(httpx.post(chat, json={"model": "demo", "messages": [{"role": "user", "content": long_prompt}]}), 400)
    assert "maximum context length is 1024 tokens" in err["message"] and err["code"] == "context_length_exceeded"
    err = _error(httpx.post(chat, json={"model": "demo", "messages": msgs, "max_tokens": 5000}), 400)
    assert "1024" in err["message"] and "5000 in the completion" in err["message"]
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model="demo", prompt="hi", max_tokens=2000)
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="gpt-4o", messages=msgs, max_tokens=2)
    assert exc.value.status_code == 404 and "gpt-4o" in exc.value.message
    with pytest.raises(openai.BadRequestError, match="tools"):
        client.chat.completions.create(model="demo", messages=msgs, max_tokens=2,
                                       tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
    with pytest.raises(openai.BadRequestError, match="Invalid JSON schema"):
        client.chat.completions.create(model="demo", messages=msgs, max_tokens=2, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}})
    image = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]
    _error(httpx.post(chat, json={"model": "demo", "messages": [{"role": "user", "content": image}]}), 400)
    _error(httpx.post(server.base_url + "/completions", json={"model": "demo", "prompt": [10**9]}), 400)
    # Unknown fields are ignored, as OpenAI and vLLM do.
    ok = httpx.post(chat, json={"model": "demo", "messages": msgs, "max_tokens": 2, "some_future_field": 1},
                    timeout=60)
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["role"] == "assistant"
    assert _error(httpx.get(server.url + "/v2/nothing"), 404)
    assert _error(httpx.get(chat), 405)
    # The server still answers after all of that.
    assert client.chat.completions.create(model="demo", messages=msgs, max_tokens=2).choices[0].message


async def _one_stream(base_url: str, i: int) -> dict:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=180)
    times, text, finishes = [], "", []
    stream = await client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": f"Count to {i + 3}."}], max_tokens=12,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    usage = None
    async for chunk in stream:
        times.append(time.monotonic())
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            if c.finish_reason:
                finishes.append(c.finish_reason)
    await client.close()
    return {"first": times[1], "last": times[-1], "text": text, "finishes": finishes, "usage": usage}


def test_16_concurrent_streams(server):
    async def main():
        return await asyncio.gather(*[_one_stream(server.base_url, i) for i in range(16)])

    results = asyncio.run(main())
    for r in results:
        assert r["finishes"] == ["length"] and r["usage"].completion_tokens == 12 and r["text"]
    # They ran as one batch: every stream had started before the first one finished.
    assert max(r["first"] for r in results) < min(r["last"] for r in results)


def _wait_idle(server, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = httpx.get(server.url + "/metrics").text
        if metric(text, "wslm:num_requests_running") == 0 and metric(text, "wslm:kv_cache_usage_perc") == 0:
            return text
        assert time.monotonic() < deadline, text
        time.sleep(0.2)


def test_disconnect_aborts_and_frees_blocks(server):
    before = metric(_wait_idle(server), "wslm:request_success_total", 'finished_reason="abort"')
    body = {"model": "demo", "messages": HELLO, "stream": True, "max_tokens": 900, "ignore_eos": True}
    with httpx.stream("POST", server.base_url + "/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(12)]  # a few tokens in: it is running and holds KV blocks
        assert any('"content"' in line for line in got)
        during = httpx.get(server.url + "/metrics").text
        assert metric(during, "wslm:num_requests_running") == 1
        assert metric(during, "wslm:kv_cache_usage_perc") > 0
    # Closed mid-stream: the request is aborted and its blocks are back in the pool.
    after = _wait_idle(server, 15.0)
    assert metric(after, "wslm:request_success_total", 'finished_reason="abort"') == before + 1
    # A non-streamed request whose client gives up is aborted too.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + "/completions", json={"model": "demo", "prompt": "Once", "max_tokens": 900,
                                                           "ignore_eos": True}, timeout=2.0)
    after = _wait_idle(server, 15.0)
    assert metric(after, "wslm:request_success_total", 'finished_reason="abort"') == before + 2


def test_metrics(server, client):
    prompt = "Repeat after me: the quick brown fox jumps over the lazy dog, again and again and again."
    for _ in range(2):  # the second one hits the prefix cache
        client.completions.create(model="demo", prompt=prompt, max_tokens=3, temperature=0)
    text = httpx.get(server.url + "/metrics").text
    for name in ("wslm:num_requests_running", "wslm:num_requests_waiting", "wslm:kv_cache_usage_perc",
                 "wslm:prefix_cache_queries_total", "wslm:prefix_cache_hits_total", "wslm:prompt_tokens_total",
                 "wslm:generation_tokens_total", "wslm:num_preemptions_total"):
        assert f"# TYPE {name} " in text, name
    for name in ("wslm:time_to_first_token_seconds", "wslm:inter_token_latency_seconds",
                 "wslm:e2e_request_latency_seconds"):
        assert f"# TYPE {name} histogram" in text
        assert metric(text, name + "_count") > 0
        assert metric(text, name + "_bucket", 'le="+Inf"') == metric(text, name + "_count")
    assert metric(text, "wslm:prefix_cache_hits_total") >= 16
    assert metric(text, "wslm:generation_tokens_total") > 0 and metric(text, "wslm:prompt_tokens_total") > 0
