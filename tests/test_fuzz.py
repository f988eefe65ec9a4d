"""Hostile input against a real `wslm serve` (demo model, loopback): hundreds of generated bad requests, each
must be answered with a 4xx in OpenAI's error shape (never a 5xx, never a hang), and the server must still be
healthy and serving afterwards. Generated from a fixed seed, so a failure names a request that reproduces."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

import httpx
import pytest
from test_server_helpers import SMALL, ServerProcess

MSGS = [{"role": "user", "content": "hi"}]
CHAT = "/v1/chat/completions"
MUTATIONS = 100  # random one-field mutations of a good request (these may be valid: a 200 is fine)
COMPLETIONS = "/v1/completions"

# Values of the wrong JSON type for each kind of field.
NOT_BOOL = ["yes", "true", 1, 0, 1.0, None.__class__.__name__, [], {}, [True]]
NOT_INT = ["2", 1.5, True, [], {}, "many", [1], {"n": 1}]
NOT_NUMBER = ["0.5", True, [], {}, "hot", [0.5]]
NOT_STOP = [1, [1, 2], [["a"]], {"a": 1}, [None], True, [{"x": "y"}]]

BOOL_FIELDS = ["stream", "ignore_eos", "include_stop_str_in_output", "skip_special_tokens"]
INT_FIELDS = ["n", "max_tokens", "seed", "top_k", "min_tokens", "max_completion_tokens", "top_logprobs"]
NUMBER_FIELDS = ["temperature", "top_p", "presence_penalty", "frequency_penalty", "min_p", "repetition_penalty"]

OUT_OF_RANGE = [
    ("temperature", -1), ("temperature", -1e-9), ("top_p", 0), ("top_p", 1.5), ("top_p", -3), ("n", 0), ("n", -1),
    ("n", 129), ("n", 10**6), ("n", 100000), ("max_tokens", 0), ("max_tokens", -5), ("max_tokens", 10**12),
    ("max_tokens", 2**63), ("max_completion_tokens", 0), ("presence_penalty", 3), ("presence_penalty", -2.5),
    ("frequency_penalty", 9e9), ("min_p", 2), ("min_p", -0.1), ("repetition_penalty", 0),
    ("repetition_penalty", -1), ("repetition_penalty", 100), ("top_k", -5), ("top_k", 2**40), ("seed", 2**70),
    ("seed", -(2**70)), ("min_tokens", -1), ("min_tokens", 10**9), ("top_logprobs", 21), ("top_logprobs", 10**6),
    ("stop_token_ids", [-1]), ("stop_token_ids", [10**9]), ("stop_token_ids", [2**70]),
]


def _chat(**fields) -> dict:
    return {"model": "demo", "messages": MSGS, "max_tokens": 2, **fields}


def _completion(**fields) -> dict:
    return {"model": "demo", "prompt": "hi", "max_tokens": 2, **fields}


def _json(obj) -> bytes:
    return json.dumps(obj).encode()


def bad_requests(rng: random.Random) -> Iterator[tuple[str, str, bytes | object]]:
    """(name, path, body) triples; body is bytes, or an iterator of bytes (sent chunked, no length)."""
    # Wrong types, on both endpoints.
    for field in BOOL_FIELDS:
        for value in NOT_BOOL:
            yield f"chat {field}={value!r}", CHAT, _json(_chat(**{field: value}))
            yield f"completion {field}={value!r}", COMPLETIONS, _json(_completion(**{field: value}))
    for value in NOT_BOOL:
        yield f"chat logprobs={value!r}", CHAT, _json(_chat(logprobs=value))
        yield f"chat add_generation_prompt={value!r}", CHAT, _json(_chat(add_generation_prompt=value))
        yield f"completion echo={value!r}", COMPLETIONS, _json(_completion(echo=value))
    for field in INT_FIELDS:
        for value in NOT_INT:
            extra = {"logprobs": True} if field == "top_logprobs" else {}
            yield f"chat {field}={value!r}", CHAT, _json(_chat(**{field: value}, **extra))
            if field not in ("max_completion_tokens", "top_logprobs"):
                yield f"completion {field}={value!r}", COMPLETIONS, _json(_completion(**{field: value}))
    for field in NUMBER_FIELDS:
        for value in NOT_NUMBER:
            yield f"chat {field}={value!r}", CHAT, _json(_chat(**{field: value}))
            yield f"completion {field}={value!r}", COMPLETIONS, _json(_completion(**{field: value}))
    for value in NOT_STOP:
        yield f"chat stop={value!r}", CHAT, _json(_chat(stop=value))
        yield f"completion stop={value!r}", COMPLETIONS, _json(_completion(stop=value))
    # Out of range.
    for field, value in OUT_OF_RANGE:
        extra = {"logprobs": True} if field == "top_logprobs" else {}
        yield f"chat {field}={value}", CHAT, _json(_chat(**{field: value}, **extra))
        if field not in ("max_completion_tokens", "top_logprobs"):
            yield f"completion {field}={value}", COMPLETIONS, _json(_completion(**{field: value}))
    yield "completion logprobs=21", COMPLETIONS, _json(_completion(logprobs=21))
    yield "chat top_logprobs without logprobs", CHAT, _json(_chat(top_logprobs=2))
    # n x max_tokens that can never fit the KV pool, and a context overflow.
    yield "chat n*max_tokens over the pool", CHAT, _json(_chat(n=100, max_tokens=1000))
    yield "completion n*max_tokens over the pool", COMPLETIONS, _json(_completion(n=120, max_tokens=900))
    yield "completion 2000 prompts", COMPLETIONS, _json(_completion(prompt=["hi"] * 2000))
    yield "completion 300 prompts x n=4", COMPLETIONS, _json(_completion(prompt=[[5, 6]] * 300, n=4))
    yield "chat prompt over the context", CHAT, _json(_chat(messages=[{"role": "user", "content": "hello " * 1100}]))
    # NaN / Infinity / overflowing numbers, written raw (json.dumps would write them too, but not 1e999).
    for field in NUMBER_FIELDS + ["n", "max_tokens", "seed"]:
        for token in ("NaN", "Infinity", "-Infinity", "1e999", "-1e999"):
            raw = f'{{"model": "demo", "messages": [{{"role": "user", "content": "hi"}}], "{field}": {token}}}'
            yield f"chat {field}={token}", CHAT, raw.encode()
    # Broken UTF-8 and lone surrogates, in content, stop strings and keys.
    for junk in (b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80abc", b"\xe2\x82"):
        yield f"chat bad utf-8 {junk!r}", CHAT, b'{"model": "demo", "messages": [{"role": "user", "content": "' + \
            junk + b'"}]}'
        yield f"completion bad utf-8 {junk!r}", COMPLETIONS, b'{"model": "demo", "prompt": "a' + junk + b'"}'
    for esc in ("\\ud800", "\\udfff", "a\\udc00b", "\\ud83d", "\\ud83d\\u0041"):
        yield f"chat lone surrogate {esc}", CHAT, (
            '{"model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": "' + esc + '"}]}').encode()
        yield f"chat surrogate in stop {esc}", CHAT, (
            '{"model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}], "stop": ["'
            + esc + '"]}').encode()
        yield f"completion lone surrogate {esc}", COMPLETIONS, (
            '{"model": "demo", "max_tokens": 2, "prompt": "' + esc + '"}').encode()
        yield f"surrogate in a key {esc}", CHAT, (
            '{"model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}], "'
            + esc + '": 1}').encode()
    # Not JSON, or not an object.
    for raw in (b"", b" ", b"{", b"[", b"null", b"[]", b"5", b'"text"', b"true", b"{'a': 1}", b"{}",
                b'{"model": "demo", "messages": [}', b"\x00\x01", b'{"a":1}{"b":2}', b"\xef\xbb\xbf{}"):
        yield f"chat raw {raw[:20]!r}", CHAT, raw
        yield f"completion raw {raw[:20]!r}", COMPLETIONS, raw
    # Deep nesting, in a known field and in an unknown one.
    for depth in (65, 200, 5000, 100000):
        yield f"deep array {depth}", CHAT, b'{"model": "demo", "messages": ' + b"[" * depth + b"]" * depth + b"}"
        yield f"deep object {depth}", CHAT, b'{"model": "demo", "messages": [], "x": ' + b'{"a":' * depth + \
            b"1" + b"}" * depth + b"}"
        yield f"deep prompt {depth}", COMPLETIONS, b'{"model": "demo", "prompt": ' + b"[" * depth + b"]" * depth + b"}"
    yield "unclosed deep", CHAT, b"[" * 50000
    # Huge bodies: with a Content-Length, and chunked (no length: cut off while reading).
    huge = b'{"model": "demo", "messages": [{"role": "user", "content": "' + b"a" * (9 << 20) + b'"}]}'
    yield "huge body", CHAT, huge
    yield "huge chunked body", CHAT, (huge[i : i + (1 << 20)] for i in range(0, len(huge), 1 << 20))
    # Odd messages and content parts.
    odd_messages = [
        [], {}, "hi", [1], [None], [[]], [{"content": "hi"}], [{"role": "", "content": "hi"}],
        [{"role": 5, "content": "hi"}], [{"role": "user"}], [{"role": "user", "content": 5}],
        [{"role": "user", "content": [5]}], [{"role": "user", "content": [{"type": "text"}]}],
        [{"role": "user", "content": [{"type": "text", "text": 5}]}],
        [{"role": "user", "content": [{"type": "text", "text": None}]}],
        [{"role": "user", "content": [{"type": 5, "text": "a"}]}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}],
        [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}],
        [{"role": "user", "content": [{"type": "video", "text": "x"}]}],
        [{"role": "user", "content": [[{"type": "text", "text": "a"}]]}],
        [{"role": "user", "content": {"type": "text", "text": "a"}}],
        [{"role": "user", "content": "hi", "name": 5}],
        [{"role": "system"}],
    ]
    for messages in odd_messages:
        yield f"messages={json.dumps(messages)[:60]}", CHAT, _json({"model": "demo", "messages": messages})
    yield "missing messages", CHAT, _json({"model": "demo"})
    yield "missing prompt", COMPLETIONS, _json({"model": "demo"})
    for prompt in ([], [[]], [-1], [1.5], [True], 5, None, [[1, "a"]], [["a"]], {"a": 1}, [10**9], [2**70], ""):
        yield f"prompt={prompt!r}", COMPLETIONS, _json(_completion(prompt=prompt))
    # Hostile stop lists.
    for stop in (["x"] * 1000, ["a" * 10000], [str(i) for i in range(65)], ["b" * 513]):
        yield f"chat stop list {len(stop)}x{len(stop[0])}", CHAT, _json(_chat(stop=stop))
        yield f"completion stop list {len(stop)}x{len(stop[0])}", COMPLETIONS, _json(_completion(stop=stop))
    # Unknown models, and unknown fields next to a bad one.
    for model in ("gpt-4o", "demo ", "../demo", "", "x" * 5000, 5, None, ["demo"]):
        body = _chat(model=model)
        if model in ("", None):
            body["n"] = -1  # an empty or missing model is the default one: make the request bad otherwise
        yield f"model={str(model)[:20]!r}", CHAT, _json(body)
    for i in range(20):
        unknown = {f"field_{rng.randrange(10**6)}": rng.choice([1, "x", None, [1], {"a": 1}]) for _ in range(5)}
        yield f"unknown fields + bad n #{i}", CHAT, _json(_chat(n=-rng.randrange(1, 100), **unknown))
    # Structured output and tools with hostile payloads.
    for rf in ({"type": "json_schema", "json_schema": {"name": "x", "schema": 5}}, {"type": "json_schema"},
               {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}},
               {"type": "no_such_format"}, {"type": 5}, "json", ["json_object"]):
        yield f"response_format={json.dumps(rf)[:50]}", CHAT, _json(_chat(response_format=rf))
    for so in ({"regex": "(unclosed"}, {"regex": 5}, {"choice": []}, {"choice": "a"}, {"json": "{not json"},
               {"grammar": "root ::= ("}):
        yield f"structured_outputs={json.dumps(so)[:50]}", CHAT, _json(_chat(structured_outputs=so))
    for tools in ("x", [5], [{"type": "function"}], [{"type": "function", "function": {"name": 5}}], {"a": 1}):
        yield f"tools={json.dumps(tools)[:50]}", CHAT, _json(_chat(tools=tools))
    for bias in ({"x": 1}, {"1": 1000}, {"-1": 5}, {"99999999": 1}, [1], "a", {"1": "a"}):
        yield f"logit_bias={json.dumps(bias)[:50]}", CHAT, _json(_chat(logit_bias=bias))
    # Tool calls and chat extras with the wrong shapes.
    for messages in ([{"role": "assistant", "tool_calls": "x"}], [{"role": "assistant", "tool_calls": [5]}],
                     [{"role": "tool", "content": 5, "tool_call_id": "a"}], [{"role": "user", "content": "hi",
                     "tool_calls": [{"function": {"name": 5}}]}]):
        yield f"tool messages {json.dumps(messages)[:50]}", CHAT, _json({"model": "demo", "messages": messages})
    for extra in ({"tool_choice": 5}, {"tool_choice": {"type": "function"}}, {"chat_template_kwargs": "x"},
                  {"chat_template_kwargs": [1]}, {"continue_final_message": "yes"}, {"chat_template": 5},
                  {"logprobs": True, "top_logprobs": 10**9}):
        yield f"chat extra {json.dumps(extra)[:50]}", CHAT, _json(_chat(**extra))
    # The other POST endpoints (embeddings, score, rerank, invocations) with junk.
    for path in ("/v1/embeddings", "/score", "/rerank", "/invocations"):
        for body in (b"{", b"[]", b'{"input": ' + b"[" * 5000 + b"]" * 5000 + b"}", _json({"input": None}),
                     _json({"model": "nope", "input": "x"}), _json({"input": [[-1]]}), _json({"input": 5}),
                     _json({"text_1": 5, "text_2": []}), _json({"query": None, "documents": 5}),
                     b'{"input": "\\ud800"}', b'{"input": NaN}'):
            yield f"{path} {body[:40]!r}", path, body
    # Unsupported features are refused, never ignored.
    yield "best_of", COMPLETIONS, _json(_completion(best_of=3))
    yield "stream_options without stream", CHAT, _json(_chat(stream_options={"include_usage": True}))
    yield "stream_options wrong type", CHAT, _json(_chat(stream=True, stream_options={"include_usage": "yes"}))
    # Tokenizer endpoints.
    for tokens in ([-1], [10**9], ["a"], "abc", [1.5], [True], None, [[1]]):
        yield f"detokenize {tokens!r}", "/detokenize", _json({"model": "demo", "tokens": tokens})
    for body in ({"prompt": 5}, {"messages": "x"}, {"model": "nope", "prompt": "x"}, {"prompt": "x", "add_special_tokens": "no"}):
        yield f"tokenize {body}", "/tokenize", _json(body)


def mutations(rng: random.Random, count: int) -> Iterator[tuple[str, str, bytes]]:
    """A good request with one field replaced by a random value: often valid, so a 200 is fine here; a 5xx
    or a malformed error is not."""
    junk = [None, "", "zz", -1, 0, 1.5, [], {}, [None], {"a": []}, True, 10**30, -(10**30), 2**63, 1e300, [0] * 50]
    fields = BOOL_FIELDS + INT_FIELDS + NUMBER_FIELDS + ["stop", "messages", "stop_token_ids", "model", "stream_options"]
    for i in range(count):
        field = rng.choice(fields)
        value = rng.choice(junk)
        yield f"mutation #{i} {field}={value!r}", CHAT, _json(_chat(**{field: value}))


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--port", "0", *SMALL)
    yield srv
    assert srv.stop() == 0, srv.stderr()[-3000:]


def test_fuzz_bad_requests_are_4xx(server):
    rng = random.Random(1234)
    cases = list(bad_requests(rng))
    assert len(cases) >= 500, len(cases)
    failures = []
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for name, path, body in cases:
            r = http.post(path, content=body, headers={"content-type": "application/json"})
            problem = _check_error(r)
            if problem:
                failures.append(f"{name}: {problem}")
        for name, path, body in mutations(rng, MUTATIONS):
            r = http.post(path, content=body, headers={"content-type": "application/json"})
            problem = None if r.status_code == 200 else _check_error(r)
            if problem:
                failures.append(f"{name}: {problem}")
    assert not failures, f"{len(failures)} of {len(cases) + MUTATIONS} bad requests were not a clean 4xx:\n" + "\n".join(
        failures[:30])
    # Still healthy, and a normal request is served in a few seconds.
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    ok = httpx.post(server.url + CHAT, json=_chat(max_tokens=4, temperature=0), timeout=10)
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["role"] == "assistant"
    stats = httpx.get(server.url + "/metrics", timeout=10).text
    assert "Traceback" not in server.stderr(), server.stderr()[-3000:]
    assert "wslm:num_requests_running" in stats


def _check_error(r: httpx.Response) -> str | None:
    if not 400 <= r.status_code < 500:
        return f"status {r.status_code}: {r.text[:300]}"
    try:
        body = r.json()
    except ValueError:
        return f"status {r.status_code}, not JSON: {r.text[:200]!r}"
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or set(error) != {"message", "type", "param", "code"} or not error["message"]:
        return f"status {r.status_code}, not OpenAI's error shape: {r.text[:300]}"
    return None
