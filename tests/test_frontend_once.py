"""One path per concern: a chat request through the HTTP server is rendered, truncated, validated and
grammar-compiled exactly once (the front end's InputProcessor, in a worker thread), and its SamplingParams
copied once; LLM.chat takes the same path. Counted on a real engine (a tiny Llama) behind the real app."""

from __future__ import annotations

from collections import Counter

import httpx
import pytest
from hub_server import make_tiny_llama

from wslm.backend.config import EngineConfig
from wslm.backend.frontend import validation
from wslm.backend.frontend.input_processor import InputProcessor
from wslm.backend.frontend.llm_engine import LLMEngine
from wslm.backend.sampling_params import SamplingParams
from wslm.backend.structured.compiler import StructuredOutputCompiler

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from test_server_helpers import serve_in_thread

    from wslm.backend.entrypoints.openai.serving_base import ServerState
    from wslm.backend.frontend.async_engine import AsyncEngine

    folder = make_tiny_llama(tmp_path_factory.mktemp("tiny-once"))
    engine = LLMEngine(EngineConfig(model=str(folder), dtype="float32", device="cpu", kv_cache_memory=8 << 20,
                                    chat_template="{% for m in messages %}{{ m['content'] }}\n{% endfor %}"))
    state = ServerState(AsyncEngine(engine), engine.tokenizer, ["tiny"], engine.max_model_len,
                        limits=engine.limits, vocab_size=engine.model_config.vocab_size)
    url, server, thread = serve_in_thread(state)
    yield engine, url
    server.should_exit = True
    thread.join(30)


@pytest.fixture
def calls(monkeypatch) -> Counter:
    counts: Counter = Counter()

    def counting(owner, name: str):
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            counts[name] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    counting(InputProcessor, "render_chat")
    counting(InputProcessor, "truncate")
    counting(validation, "check_request")
    counting(StructuredOutputCompiler, "compile")
    counting(SamplingParams, "clone")
    return counts


def test_a_chat_request_is_checked_truncated_and_compiled_once(served, calls):
    _, url = served
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello there " * 20}], "max_tokens": 4,
            "truncate_prompt_tokens": 16,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 16  # the truncated prompt is what ran and what is counted
    assert calls == Counter(render_chat=1, truncate=1, check_request=1, compile=1, clone=1)


def test_a_bad_request_is_refused_once_with_its_field_named(served, calls):
    engine, url = served
    too_long = "hi " * (engine.max_model_len + 8)  # over the context: the prompt's field is named
    body = {"model": "tiny", "messages": [{"role": "user", "content": too_long}], "max_tokens": 4}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    assert calls["check_request"] == 1


def test_llm_chat_takes_the_same_path(served, calls):
    from wslm.backend.entrypoints.llm import LLM

    served_engine, _ = served
    # An engine of its own, built as the served one is: LLM steps it from this thread, and two threads must
    # never step one core (the server's engine thread steps the served one).
    llm = LLM.__new__(LLM)  # LLM is a thin loop over an LLMEngine
    llm.llm_engine = LLMEngine(served_engine.config)
    llm._ids = iter(range(10**6))
    out = llm.chat([{"role": "user", "content": "hello there " * 20}],
                   SamplingParams(max_tokens=4, truncate_prompt_tokens=16))
    assert len(out[0].prompt_token_ids) == 16
    assert calls == Counter(render_chat=1, truncate=1, check_request=1, clone=1)
