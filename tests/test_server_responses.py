"""POST /v1/responses (OpenAI's Responses API) on a real `wslm serve` of the demo model, through the official
openai client: plain and streamed (the event sequence its stream helper accumulates), stored responses
(retrieve, previous_response_id, cancel, delete), a forced function call round trip, json_schema, and the
400s / 404s that name what is wrong."""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest
from test_server_helpers import SMALL, ServerProcess

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
# A one-string choice makes the model write exactly that text (and stop): deterministic replies, through the
# vLLM extra that /v1/responses passes on to the chat path.
SAY = {"structured_outputs": {"choice": ["Bonjour tout le monde"]}}


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--port", "0", *SMALL)
    yield srv
    assert srv.stop() == 0, srv.stderr()[-3000:]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def test_create_retrieve_and_stream(client, server):
    r = client.responses.create(model="demo", instructions="Answer in French.", input="Say hello.",
                                max_output_tokens=16, extra_body=SAY)
    assert r.object == "response" and r.id.startswith("resp_") and r.status == "completed"
    assert r.output_text == "Bonjour tout le monde" and r.incomplete_details is None
    [msg] = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.status == "completed"
    assert msg.content[0].type == "output_text"
    u = r.usage
    assert u.input_tokens > 0 and u.output_tokens > 0 and u.total_tokens == u.input_tokens + u.output_tokens
    assert u.input_tokens_details.cached_tokens >= 0 and u.output_tokens_details.reasoning_tokens == 0
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.status == "completed"

    events = list(client.responses.create(model="demo", input="Say hello.", max_output_tokens=16, stream=True,
                                          extra_body=SAY))
    types = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1
    assert [t for t in types if t != "response.output_text.delta"] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    assert types.index("response.output_text.delta") == 4
    final = events[-1].response
    assert final.status == "completed" and final.output_text == "".join(deltas) == "Bonjour tout le monde"
    assert events[-4].text == final.output_text and events[-2].item.id == events[2].item.id == final.output[0].id
    assert client.responses.retrieve(final.id).output_text == final.output_text

    # max_output_tokens cuts it: incomplete, and says why (streamed as response.incomplete).
    cut = client.responses.create(model="demo", input="Tell a story.", max_output_tokens=3,
                                  extra_body={"ignore_eos": True})
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 3 and cut.output[0].status == "incomplete"
    with client.responses.stream(model="demo", input="Tell a story.", max_output_tokens=3,
                                 extra_body={"ignore_eos": True}) as stream:
        kinds = [e.type for e in stream]
    assert kinds[-1] == "response.incomplete"


def test_previous_response_id_continues_the_conversation(client, server):
    first = client.responses.create(model="demo", input="My name is Ada.", max_output_tokens=16, extra_body=SAY)
    second = client.responses.create(model="demo", input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=16, extra_body=SAY)
    assert second.previous_response_id == first.id and second.status == "completed"
    # The prompt is exactly the whole conversation, rendered as the chat path renders it.
    chat = [{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"}]
    ids = httpx.post(server.url + "/tokenize", json={"messages": chat}).json()["tokens"]
    assert second.usage.input_tokens == len(ids)

    # store=false: answered, but not kept.
    unstored = client.responses.create(model="demo", input="Hi", max_output_tokens=2, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model="demo", input="Hi", previous_response_id=unstored.id, max_output_tokens=2)
    assert err.value.body["param"] == "previous_response_id" and unstored.id in err.value.body["message"]


def test_forced_function_call_round_trip(client):
    r = client.responses.create(model="demo", input="What is the weather in Paris?", tools=[WEATHER],
                                tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=40,
                                temperature=0)
    assert r.status == "completed"
    [call] = r.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert isinstance(json.loads(call.arguments)["city"], str)
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}
    # Continued from the store ...
    follow = client.responses.create(model="demo", previous_response_id=r.id, input=[result], max_output_tokens=16,
                                     extra_body=SAY)
    assert follow.status == "completed" and follow.output_text == "Bonjour tout le monde"
    # ... or with the whole conversation sent back as items (what clients do with store=false): same prompt.
    items = [{"role": "user", "content": "What is the weather in Paris?"}, call.model_dump(exclude_none=True),
             result]
    again = client.responses.create(model="demo", input=items, max_output_tokens=16, extra_body=SAY, store=False)
    assert again.usage.input_tokens == follow.usage.input_tokens and again.output_text == follow.output_text


def test_streamed_function_call_and_json_schema(client):
    with client.responses.stream(model="demo", input="Weather in Oslo?", tools=[WEATHER],
                                 tool_choice={"type": "function", "name": "get_weather"},
                                 max_output_tokens=40, temperature=0) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    [call] = final.output
    assert call.type == "function_call" and json.loads(call.arguments)["city"]

    schema = {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["age"], "additionalProperties": False}
    r = client.responses.create(model="demo", input="How old is Ada? As JSON.", max_output_tokens=24, temperature=0,
                                text={"format": {"type": "json_schema", "name": "age", "schema": schema,
                                                 "strict": True}})
    assert r.status == "completed"
    assert set(json.loads(r.output_text)) == {"age"}
    assert r.text.format.type == "json_schema"


def test_cancel_and_delete(client, server):
    stream = client.responses.create(model="demo", input="Tell a long story.", max_output_tokens=400, stream=True,
                                     extra_body={"ignore_eos": True})
    events = iter(stream)
    created = next(events)
    rid = created.response.id
    assert client.responses.retrieve(rid).status == "in_progress"
    seen = []
    cancelled = threading.Event()
    for e in events:
        seen.append(e)
        if len(seen) == 4 and not cancelled.is_set():
            assert client.responses.cancel(rid).status == "cancelled"
            cancelled.set()
    assert seen[-1].type == "response.incomplete" and seen[-1].response.status == "cancelled"
    assert seen[-1].response.usage.output_tokens < 400
    assert client.responses.retrieve(rid).status == "cancelled"

    done = client.responses.create(model="demo", input="Hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(done.id)  # only a response still being written can be cancelled
    client.responses.delete(done.id)
    for call in (lambda: client.responses.retrieve(done.id), lambda: client.responses.delete(done.id),
                 lambda: client.responses.cancel("resp_unknown")):
        with pytest.raises(openai.NotFoundError) as err:
            call()
        assert err.value.body["code"] == "response_not_found"


@pytest.mark.parametrize("body,param", [
    ({"input": [{"role": "wizard", "content": "hi"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "messages.0.content.0"),
    ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, "input[0].type"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "hi", "tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]}, "tool_choice"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "bogus"}}}},
     "text.format"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "max_output_tokens": 100000}, "max_output_tokens"),
    ({"input": "hi", "background": True}, "background"),
    ({"input": []}, "input"),
    ({"input": 5}, "input"),
])
def test_bad_requests_name_the_field(server, body, param):
    r = httpx.post(server.base_url + "/responses", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_unknown_endpoint_404_lists_the_served_ones(server):
    r = httpx.post(server.base_url + "/response", json={})
    assert r.status_code == 404
    message = r.json()["error"]["message"]
    assert "POST /v1/response" in message and "POST /v1/responses" in message and "under /v1" not in message
    r = httpx.post(server.url + "/chat/completions", json={})
    assert r.status_code == 404 and "under /v1" in r.json()["error"]["message"]


def test_store_is_bounded_and_chains_break_clearly():
    """--max-stored-responses: the least recently used response goes first; continuing a conversation whose
    earlier turn went is a 404 that names that turn."""
    from wslm.backend.entrypoints.openai.errors import APIError
    from wslm.backend.entrypoints.openai.serving_responses import ResponseStore, StoredResponse

    def turn(text, previous=None):
        return StoredResponse({"status": "completed"}, [{"role": "user", "content": text}], previous,
                              reply=[{"role": "assistant", "content": text.upper()}])

    store = ResponseStore(2)
    store.put("a", turn("a"))
    store.put("b", turn("b", "a"))
    assert [m["content"] for m in store.history("b")] == ["a", "A", "b", "B"]
    store.put("c", turn("c"))  # "a" is the least recently used (history touched a, then b)
    assert store.get("a") is None and store.get("b") is not None
    with pytest.raises(APIError) as err:
        store.history("b")
    assert err.value.status_code == 404 and "'a' (an earlier turn of 'b')" in err.value.message
    assert err.value.param == "previous_response_id" and "--max-stored-responses" in err.value.message
    none = ResponseStore(0)
    none.put("x", turn("x"))
    assert none.get("x") is None


def test_input_items_as_clients_send_them_back():
    """The items a client (the Agents SDK) sends back on its next turn: output messages with output_text parts,
    a reasoning item, function calls joining the assistant message before them, their outputs as tool
    messages, a developer message."""
    from wslm.backend.entrypoints.openai.serving_responses import ResponsesRequest, input_messages

    req = ResponsesRequest.model_validate({"input": [
        {"role": "developer", "content": "Be brief."},
        {"content": "Weather?", "role": "user"},
        {"id": "rs_1", "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Hm."}]},
        {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Checking.", "annotations": [], "logprobs": []}]},
        {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "w", "arguments": "{}",
         "status": "completed"},
        {"type": "function_call", "call_id": "call_2", "name": "t", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "noon"}]},
    ]})
    assert input_messages(req) == [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Hm.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{}"}},
            {"id": "call_2", "type": "function", "function": {"name": "t", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
    ]


def test_max_stored_responses_flag():
    import argparse

    from wslm.backend.entrypoints.cli import serve as serve_cli

    sub = argparse.ArgumentParser().add_subparsers()
    serve_cli.register(sub)
    parser = sub.choices["serve"]
    assert parser.parse_args([]).max_stored_responses == 1000
    assert parser.parse_args(["--max-stored-responses", "0"]).max_stored_responses == 0
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-stored-responses", "-1"])


def test_openai_agents_runner(server):
    """The openai-agents SDK's default path (Runner.run_sync over the Responses API), where it is installed:
    a plain turn, and a forced tool call whose result ends the run."""
    agents = pytest.importorskip("agents")

    def run(agent, prompt):
        agents.set_default_openai_client(openai.AsyncOpenAI(base_url=server.base_url, api_key="unused"),
                                         use_for_tracing=False)
        return agents.Runner.run_sync(agent, prompt, max_turns=2)

    agents.set_tracing_disabled(True)
    plain = agents.Agent(name="a", instructions="Be brief.", model="demo",
                         model_settings=agents.ModelSettings(extra_body=SAY))
    assert run(plain, "Say hello.").final_output == "Bonjour tout le monde"

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"Sunny in {city}"

    tool_agent = agents.Agent(name="w", model="demo", tools=[get_weather], tool_use_behavior="stop_on_first_tool",
                              model_settings=agents.ModelSettings(tool_choice="get_weather", temperature=0,
                                                                  max_tokens=40))
    result = run(tool_agent, "Weather in Paris?")
    assert result.final_output.startswith("Sunny in ")


def test_reasoning_item_and_summary_events():
    """With a reasoning parser, the reasoning is an item of its own before the message, streamed as reasoning
    text (and as a summary when reasoning.summary asks for one)."""
    from wslm.backend.entrypoints.openai.chat_reply import ChatReply
    from wslm.backend.entrypoints.openai.reasoning import get_reasoning_parser
    from wslm.backend.entrypoints.openai.serving_responses import _Output

    out = _Output(ChatReply(get_reasoning_parser("qwen3", False)), summary=True)
    text = "".join(out.feed(piece, False) for piece in ("<think>Hm, ", "easy.</think>", "Four."))
    text += out.feed("", True) + out.finish("completed")
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
        "response.reasoning_summary_part.added", "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done", "response.reasoning_summary_part.done",
        "response.output_item.done", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    reasoning, message = out.items
    assert reasoning["type"] == "reasoning" and reasoning["content"][0]["text"] == "Hm, easy."
    assert reasoning["summary"] == [{"type": "summary_text", "text": "Hm, easy."}]
    assert message["content"][0]["text"] == "Four." and message["status"] == "completed"
    assert out.chat_messages() == [{"role": "assistant", "content": "Four.", "reasoning_content": "Hm, easy."}]
