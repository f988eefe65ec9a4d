"""Ollama's API on `wslm serve`'s port (issue 35 item 3), driven by the official `ollama` Python client as
apps use it: chat and generate (plain and streamed, options, format as JSON or a schema, tool calls), embed
and the older embeddings call, list, show, ps, pull (from a loopback hub) and delete; the answers equal the
OpenAI routes' for the same request. One real server on the demo model, with a tiny random sentence-
transformers encoder in its model pool."""

from __future__ import annotations

import json

import httpx
import ollama
import pytest
from hub_server import FakeHub, make_tiny_llama
from test_embeddings import make_encoder
from test_server_helpers import SMALL, ServerProcess

GREEDY = {"temperature": 0, "num_predict": 8, "seed": 1}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with FakeHub() as h:
        h.add_repo("org/tiny", make_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))
        yield h


@pytest.fixture(scope="module")
def server(tmp_path_factory, hub):
    enc, _ = make_encoder(tmp_path_factory.mktemp("enc"), "bert", "mean", seed=5)
    home = tmp_path_factory.mktemp("hf")
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(home / "home"), "HF_HUB_CACHE": str(home / "cache"),
           "WSLM_MODELS_DIR": str(home / "models"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    srv = ServerProcess("demo", "--port", "0", *SMALL, "--model-pool", f"enc={enc}",
                        "--enable-auto-tool-choice", "--tool-call-parser", "hermes", env=env)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return ollama.Client(host=server.url, timeout=120)


def _openai_chat(server, messages, **extra) -> dict:
    body = {"model": "demo", "messages": messages, "temperature": 0, "max_tokens": 8, "seed": 1, **extra}
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120).json()


def test_chat_plain_and_streamed_equal_the_openai_route(server, client):
    messages = [{"role": "user", "content": "Name a colour."}]
    reply = client.chat(model="demo", messages=messages, options=GREEDY, stream=False)
    expected = _openai_chat(server, messages)["choices"][0]["message"]["content"]
    assert reply.message.content == expected and reply.done and reply.done_reason == "length"
    assert reply.eval_count == 8 and reply.prompt_eval_count > 5 and reply.total_duration > 0
    parts = list(client.chat(model="demo:latest", messages=messages, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == expected
    assert [p.done for p in parts].count(True) == 1 and parts[-1].done and parts[-1].eval_count == 8


def test_generate_template_raw_context_and_load(server, client):
    out = client.generate(model="demo", prompt="Name a colour.", options=GREEDY)
    expected = _openai_chat(server, [{"role": "user", "content": "Name a colour."}])["choices"][0]["message"]
    assert out.response == expected["content"] and out.context and out.done_reason == "length"
    raw = client.generate(model="demo", prompt="The capital of France is", raw=True, options=GREEDY)
    completion = httpx.post(server.url + "/v1/completions", json={
        "model": "demo", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}, timeout=120).json()
    assert raw.response == completion["choices"][0]["text"]
    streamed = "".join(p.response for p in client.generate(model="demo", prompt="The capital of France is",
                                                           raw=True, options=GREEDY, stream=True))
    assert streamed == raw.response
    # The old conversation memory: the next prompt is appended to the returned tokens.
    follow = client.generate(model="demo", prompt="And of Spain?", context=out.context, options=GREEDY)
    assert follow.done and len(follow.context) > len(out.context)
    loaded = client.generate(model="demo", prompt="")
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""


def test_options_stop_and_format(server, client):
    out = client.chat(model="demo", messages=[{"role": "user", "content": "Count: 1, 2, 3"}],
                      options={"temperature": 0, "num_predict": 30, "stop": [","]})
    assert "," not in out.message.content
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}},
              "required": ["colour"]}
    out = client.chat(model="demo", messages=[{"role": "user", "content": "A colour as JSON."}],
                      format=schema, options={"temperature": 0, "num_predict": 40})
    assert isinstance(json.loads(out.message.content)["colour"], str)
    out = client.generate(model="demo", prompt="A colour as JSON:", format=schema, options={"temperature": 0,
                                                                                            "num_predict": 40})
    assert isinstance(json.loads(out.response)["colour"], str)
    # "json": any object; the demo may talk until num_predict cuts it, so a cut reply need only start one.
    out = client.generate(model="demo", prompt="A JSON object:", format="json", options={"temperature": 0,
                                                                                         "num_predict": 40})
    assert out.response.lstrip().startswith("{")
    if out.done_reason == "stop":
        assert isinstance(json.loads(out.response), dict)
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model="demo", messages=[{"role": "user", "content": "x"}], options={"temperature": "hot"})
    assert err.value.status_code == 400 and "options.temperature" in err.value.error
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model="nope", messages=[{"role": "user", "content": "x"}])
    assert err.value.status_code == 404 and "demo" in err.value.error


def test_tool_call_in_ollamas_shape(server, client):
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                             "parameters": {"type": "object", "properties": {
                                                 "city": {"type": "string"}}, "required": ["city"]}}}
    # The demo model does not call tools by itself; a forced tool_choice through the OpenAI route gives the
    # reference, and the history with a call and its result must render on the Ollama route.
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "content": "Sunny, 21 C", "tool_name": "get_weather"}]
    out = client.chat(model="demo", messages=messages, tools=[tool], options=GREEDY)
    assert out.done and isinstance(out.message.content, str)
    raw = httpx.post(server.url + "/api/chat", json={"model": "demo", "stream": False, "options": GREEDY,
                                                     "messages": messages[:1], "tools": [tool]}, timeout=120)
    assert raw.status_code == 200, raw.text
    msg = raw.json()["message"]
    for call in msg.get("tool_calls") or []:  # Ollama's shape: arguments as an object, no ids
        assert isinstance(call["function"]["arguments"], dict) and "id" not in call


def test_embed_and_embeddings(server, client):
    out = client.embed(model="enc", input=["the cat sat on a mat", "what is the sky"])
    assert len(out.embeddings) == 2 and len(out.embeddings[0]) > 8
    ref = httpx.post(server.url + "/v1/embeddings", json={"model": "enc", "input": "the cat sat on a mat"},
                     timeout=120).json()["data"][0]["embedding"]
    assert out.embeddings[0] == pytest.approx(ref, abs=1e-6)
    single = client.embeddings(model="enc", prompt="the cat sat on a mat")
    assert list(single.embedding) == pytest.approx(ref, abs=1e-6)
    with pytest.raises(ollama.ResponseError) as err:
        client.embed(model="demo", input="x")
    assert err.value.status_code == 400 and "embedding" in err.value.error


def test_list_show_ps_version(server, client):
    names = [m.model for m in client.list().models]
    assert names[:1] == ["demo"] and "enc" in names
    demo = client.list().models[0]
    assert demo.size > 50_000_000 and demo.details.format == "gguf" and demo.details.parameter_size.endswith("M")
    shown = client.show("demo")
    assert "completion" in shown.capabilities and "tools" in shown.capabilities
    assert "im_start" in shown.template and shown.modelinfo["general.architecture"]
    running = [m.model for m in client.ps().models]
    assert "demo" in running
    assert httpx.get(server.url + "/api/version", timeout=30).json()["version"]


def test_pull_and_delete(server, client, hub):
    """/api/pull downloads through wslm's puller from the (loopback) hub, progress in Ollama's shape; the
    model then lists in /api/tags (the pool is not `all` here, so through /api/show's catalog) and deletes."""
    events = list(client.pull("org/tiny", stream=True))
    statuses = [e.status for e in events]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success", statuses
    assert any(e.completed and e.total and e.completed == e.total for e in events), statuses
    assert client.pull("org/tiny", stream=False).status == "success"  # already there: a quick no-op
    with pytest.raises(ollama.ResponseError) as err:
        client.pull("org/nope")
    assert "org/nope" in err.value.error
    client.delete("org/tiny")
    with pytest.raises(ollama.ResponseError) as err:
        client.delete("org/tiny")
    assert err.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as err:
        client.delete("demo")
    assert err.value.status_code in (400, 409)
