"""Tool calling, reasoning and the one chat-rendering path, through the official openai client on real
`wslm serve` processes running a tiny random model with a test chat template (tools, tool results, <think>).

The model's output is scripted with the grammar engine: a `structured_outputs.choice` of one string makes the
real engine write exactly that text, token by token, so each tool-call format and the reasoning split are
parsed from genuine streamed model output (no test hook in the server)."""

from __future__ import annotations

import json

import openai
import pytest
from test_server_helpers import ServerProcess

KEY = "sekret"
TINY = ["--kv-cache-memory", "16MiB", "--max-model-len", "512", "--uvicorn-log-level", "warning"]

TEMPLATE = """
{%- if tools %}<|im_start|>system
Tools:
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
Call one as <tool_call>{"name": NAME, "arguments": ARGS}</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}<|im_start|>{{ message.role }}
{% if message.content %}{{ message.content }}{% endif %}
{%- if message.tool_calls %}{% for call in message.tool_calls %}<tool_call>
{{ {"name": call.function.name, "arguments": call.function.arguments} | tojson }}
</tool_call>{% endfor %}{% endif %}
{%- if message.tool_call_id %} [for {{ message.tool_call_id }}]{% endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif %}{% endif %}"""

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "Weather in Paris and the time?"}]

# What each format's model writes for the same two calls, after a short preamble where the format allows one.
SCRIPTS = {
    "hermes": 'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
              '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
    "mistral": 'Let me look.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, '
               '{"name": "get_time", "arguments": {}}]',
    "llama3_json": '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}; '
                   '{"name": "get_time", "parameters": {}}',
    "pythonic": '[get_weather(city="Paris", days=3), get_time()]',
}
PREAMBLE = {"hermes": "Let me look.", "mistral": "Let me look.", "llama3_json": None, "pythonic": None}


@pytest.fixture(scope="module")
def tiny_folder(tiny_models, tmp_path_factory):
    """The session's tiny llama (its tokenizer is read from the demo GGUF once per session) and the test
    template."""
    template = tmp_path_factory.mktemp("tools") / "template.jinja"
    template.write_text(TEMPLATE)
    return tiny_models["llama"], template


def _server(tiny_folder, *flags: str) -> ServerProcess:
    folder, template = tiny_folder
    return ServerProcess("--port", "0", "--model", str(folder), "--chat-template", str(template), *TINY,
                         "--dtype", "float32", "--max-num-seqs", "8", "--served-model-name", "x", *flags)


@pytest.fixture(scope="module")
def server(tiny_folder):
    """The template's <tool_call> and <think> pick the hermes and qwen3 parsers on their own. With an API key,
    which the anthropic client sends as x-api-key."""
    srv = _server(tiny_folder, "--api-key", KEY)
    yield srv
    assert srv.stop() == 0, srv.stderr()[-3000:]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=120)


def _script(text: str) -> dict:
    return {"structured_outputs": {"choice": [text]}}


def _assemble(stream) -> tuple[str, str, dict[int, dict], str | None]:
    """Fold a streamed chat completion the way client libraries do: content, reasoning, calls by index."""
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in stream:
        for c in chunk.choices:
            d = c.delta
            content += d.content or ""
            reasoning += getattr(d, "reasoning_content", None) or ""
            for tc in d.tool_calls or []:
                call = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                if tc.id:
                    assert call["id"] is None and call["arguments"] == "", "id and name come first, once"
                    call["id"], call["name"] = tc.id, tc.function.name
                else:
                    assert call["id"] is not None, "arguments before the call's id and name"
                call["arguments"] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    return content, reasoning, calls, finish


def test_server_picked_parsers_from_template(server, client):
    log = server.stderr()
    assert "parser hermes picked from the chat template" in log and "parser qwen3 picked" in log
    card = client.models.list().data[0]
    assert {"chat", "messages", "tool_calls", "reasoning"} <= set(card.capabilities)


def _check_format(client, fmt: str) -> None:
    body = _script(SCRIPTS[fmt])
    r = client.chat.completions.create(model="x", messages=ASK, tools=[WEATHER, TIME], max_tokens=120,
                                       temperature=0, extra_body=body)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert (choice.message.content or None) == PREAMBLE[fmt]
    calls = choice.message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris", "days": 3}
    assert json.loads(calls[1].function.arguments) == {}
    assert all(c.id.startswith("call_") and c.type == "function" for c in calls)
    stream = client.chat.completions.create(model="x", messages=ASK, tools=[WEATHER, TIME], max_tokens=120,
                                            temperature=0, stream=True, extra_body=body)
    content, _, streamed, finish = _assemble(stream)
    assert finish == "tool_calls" and (content or None) == PREAMBLE[fmt]
    assert [(c["name"], c["arguments"]) for c in streamed.values()] == \
        [(c.function.name, c.function.arguments) for c in calls]


def test_hermes_calls_stream_and_whole(client):
    _check_format(client, "hermes")


@pytest.mark.slow  # a server each (vLLM picks the parser per server): ~8 s apiece on an idle 2-core machine
@pytest.mark.parametrize(("fmt", "flag"), [("mistral", "mistral"), ("llama3_json", "llama4_json"),
                                           ("pythonic", "pythonic")])
def test_other_formats(tiny_folder, fmt, flag):
    """llama3_json through vLLM's other name for it (llama4_json), as launch scripts may spell it."""
    srv = _server(tiny_folder, "--enable-auto-tool-choice", "--tool-call-parser", flag)
    try:
        _check_format(openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=120), fmt)
    finally:
        assert srv.stop() == 0, srv.stderr()[-3000:]


def test_plain_text_and_tool_choice_none(client):
    text = "No tools needed <tool"  # a half marker at the end is content after all
    for choice in ("auto", "none"):
        r = client.chat.completions.create(model="x", messages=ASK, tools=[WEATHER], tool_choice=choice,
                                           max_tokens=40, temperature=0, extra_body=_script(text))
        assert r.choices[0].message.content == text and not r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "stop"
    r = client.chat.completions.create(model="x", messages=ASK, tools=[WEATHER], tool_choice="none", max_tokens=120,
                                       temperature=0, extra_body=_script(SCRIPTS["hermes"]))
    assert r.choices[0].message.content == SCRIPTS["hermes"] and not r.choices[0].message.tool_calls


NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def test_required_and_named_choice_forced_by_grammar(client):
    for seed in range(3):
        r = client.chat.completions.create(model="x", messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                           max_tokens=80, temperature=1.0, seed=seed, parallel_tool_calls=False)
        choice = r.choices[0]
        if choice.finish_reason == "length":
            continue  # a random model may ramble inside a string; the grammar keeps it well-formed meanwhile
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
        call = choice.message.tool_calls[0]
        assert call.function.name in ("get_weather", "get_time")
        assert isinstance(json.loads(call.function.arguments), dict)
    named = {"type": "function", "function": {"name": "get_weather"}}
    # (The reasoning parser is on: without thinking, the grammar applies from the first token.)
    stream = client.chat.completions.create(model="x", messages=ASK, tools=[WEATHER, TIME], tool_choice=named,
                                            max_tokens=60, temperature=0, stream=True, extra_body=NO_THINKING)
    content, _, calls, finish = _assemble(stream)
    assert content == "" and list(calls) == [0] and calls[0]["name"] == "get_weather"
    if finish != "length":
        assert "city" in json.loads(calls[0]["arguments"])


def _sse_chunks(server, body: dict) -> list[dict]:
    import httpx

    with httpx.stream("POST", server.url + "/v1/chat/completions", json={"model": "x", **body},
                      headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_raw_stream_delta_shape_with_n2(server):
    """OpenAI's exact tool-call delta shape, per choice of an n=2 stream: role first; then for each call one
    delta with index, id, type and name (arguments ""), then deltas with only index and an arguments piece."""
    chunks = _sse_chunks(server, {"messages": ASK, "tools": [WEATHER, TIME], "max_tokens": 120, "n": 2,
                                  "temperature": 0, "stream": True, **_script(SCRIPTS["hermes"])})
    per_choice: dict[int, list[dict]] = {0: [], 1: []}
    finish = {}
    for chunk in chunks:
        assert chunk["object"] == "chat.completion.chunk" and len(chunk["choices"]) == 1
        c = chunk["choices"][0]
        per_choice[c["index"]].append(c["delta"])
        if c["finish_reason"]:
            finish[c["index"]] = c["finish_reason"]
    assert finish == {0: "tool_calls", 1: "tool_calls"}
    ids = set()
    for deltas in per_choice.values():
        assert deltas[0] == {"role": "assistant", "content": ""}
        content, calls = "", []
        for d in deltas[1:]:
            if "tool_calls" not in d:
                assert set(d) <= {"content"}
                content += d.get("content", "")
                continue
            assert set(d) == {"tool_calls"} and len(d["tool_calls"]) == 1
            tc = d["tool_calls"][0]
            if "id" in tc:
                assert set(tc) == {"index", "id", "type", "function"} and tc["type"] == "function"
                assert tc["index"] == len(calls) and tc["function"]["arguments"] == ""
                calls.append([tc["id"], tc["function"]["name"], ""])
            else:
                assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
                assert tc["index"] == len(calls) - 1, "a call's pieces come before the next call"
                calls[tc["index"]][2] += tc["function"]["arguments"]
        assert content == "Let me look."
        assert [(n, json.loads(a)) for _, n, a in calls] == [("get_weather", {"city": "Paris", "days": 3}),
                                                             ("get_time", {})]
        ids |= {i for i, _, _ in calls}
    assert len(ids) == 4 and all(i.startswith("call_") for i in ids)


def test_parallel_tool_calls_false_keeps_the_first_call(client):
    body = _script(SCRIPTS["hermes"])
    r = client.chat.completions.create(model="x", messages=ASK, tools=[WEATHER, TIME], max_tokens=120,
                                       temperature=0, parallel_tool_calls=False, extra_body=body)
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_weather"]
    assert r.choices[0].finish_reason == "tool_calls"
    _, _, calls, finish = _assemble(client.chat.completions.create(
        model="x", messages=ASK, tools=[WEATHER, TIME], max_tokens=120, temperature=0, stream=True,
        parallel_tool_calls=False, extra_body=body))
    assert [c["name"] for c in calls.values()] == ["get_weather"] and finish == "tool_calls"


def _history(call: object = None, tool: object = None) -> list[dict]:
    call = call if call is not None else {"id": "call_1", "type": "function",
                                          "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    tool = tool if tool is not None else {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    return [*ASK, {"role": "assistant", "content": None, "tool_calls": [call] if isinstance(call, dict) else call},
            tool]


@pytest.mark.parametrize(
    ("messages", "param", "words"),
    [
        (_history(call="x"), "messages.1.tool_calls", "list"),
        (_history(call={"type": "function", "function": {"arguments": "{}"}}), "messages.1.tool_calls",
         "'name'"),
        (_history(call={"id": "c", "function": {"name": "get_weather", "arguments": "{oops"}}),
         "messages.1.tool_calls", "not valid JSON"),
        (_history(call={"id": "c", "function": {"name": "get_weather", "arguments": 5}}),
         "messages.1.tool_calls", "JSON object"),
        (_history(tool={"role": "tool", "tool_call_id": "call_1"}), "messages.2.content", "required"),
        (_history(tool={"role": "tool", "tool_call_id": 7, "content": "sunny"}), "messages.2.tool_call_id",
         "string"),
    ],
)
def test_malformed_tool_history_is_400_naming_the_field(client, messages, param, words):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="x", messages=messages, max_tokens=2)
    assert err.value.body["param"] == param and words in err.value.body["message"], err.value.body


def test_tool_result_as_content_parts(server, client):
    """A tool message whose content is a list of text parts (LangChain sends them) reaches the template joined."""
    tool = {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny"},
                                                                   {"type": "text", "text": "20C"}]}
    import httpx

    ids = httpx.post(server.url + "/tokenize", json={"messages": _history(tool=tool)},
                     headers={"Authorization": f"Bearer {KEY}"}, timeout=30).json()["tokens"]
    r = client.chat.completions.create(model="x", messages=_history(tool=tool), max_tokens=2)
    assert r.usage.prompt_tokens == len(ids)


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"tool_choice": "required"}, "tool_choice", "at least one tool"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
         "not in `tools`"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "must be"),
        ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
         "response_format", "already constrains"),
        ({"tools": [{"type": "function", "function": {"name": 5}}]}, "tools.0", "string"),
        ({"continue_final_message": True}, "continue_final_message", "cannot both"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "wat"}}}],
          "tool_choice": "required"}, "tools", "wat"),
        ({"tools": [{"type": "function", "function": {"name": n, "parameters": {"$defs": {"U": {"type": t}}}}}
                    for n, t in (("f", "string"), ("g", "integer"))], "tool_choice": "required"}, "tools", "$defs.U"),
    ],
)
def test_bad_tool_requests_are_400(client, body, param, words):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="x", messages=ASK, max_tokens=5, extra_body=body)
    assert err.value.body["param"].startswith(param) and words in err.value.body["message"], err.value.body


def test_reasoning_split_stream_and_whole(client):
    text = "<think>Two and two make four.</think>The answer is 4."
    r = client.chat.completions.create(model="x", messages=ASK, max_tokens=60, temperature=0,
                                       extra_body=_script(text))
    msg = r.choices[0].message
    assert msg.reasoning_content == "Two and two make four." and msg.content == "The answer is 4."
    content, reasoning, _, finish = _assemble(
        client.chat.completions.create(model="x", messages=ASK, max_tokens=60, temperature=0, stream=True,
                                       extra_body=_script(text)))
    assert (reasoning, content, finish) == ("Two and two make four.", "The answer is 4.", "stop")
    # Cut inside the think block (max_tokens, then a stop string): what was thought comes back, no content.
    for cut in ({"max_tokens": 6}, {"max_tokens": 60, "stop": ["four"]}):
        r = client.chat.completions.create(model="x", messages=ASK, temperature=0, extra_body=_script(text), **cut)
        msg = r.choices[0].message
        assert msg.content is None and msg.reasoning_content and "<think>" not in msg.reasoning_content
        assert "Two and two make four.".startswith(msg.reasoning_content.rstrip())
        content, reasoning, _, _ = _assemble(client.chat.completions.create(
            model="x", messages=ASK, temperature=0, stream=True, extra_body=_script(text), **cut))
        assert content == "" and reasoning == msg.reasoning_content
    # enable_thinking false: the template closes the think block in the prompt; the reply is content.
    r = client.chat.completions.create(model="x", messages=ASK, max_tokens=20, temperature=0,
                                       extra_body={**_script("Plain answer."),
                                                   "chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].message.content == "Plain answer." and r.choices[0].message.reasoning_content is None


CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": [{"type": "text", "text": "Weather"}, {"type": "text", "text": "in Paris?"}]},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'},
    {"role": "developer", "content": "Answer in English."},
]


def test_llm_chat_and_server_render_the_same_prompt(tiny_folder, server, client):
    import httpx

    from wslm.backend import LLM, SamplingParams

    folder, template = tiny_folder
    llm = LLM(str(folder), chat_template=str(template), kv_cache_memory=16 << 20, max_model_len=512,
              dtype="float32")
    kwargs = {"enable_thinking": False}
    out = llm.chat(CONVERSATION, SamplingParams(max_tokens=8, temperature=0), tools=[WEATHER],
                   chat_template_kwargs=kwargs)[0]
    ids = out.prompt_token_ids
    text = llm.get_tokenizer().decode(ids)
    assert "Weather\nin Paris?" in text and "[for call_1]" in text
    assert '"arguments": {"city": "Paris"}' in text and '"name": "get_weather"' in text
    assert "<|im_start|>system\nAnswer in English." in text and "<think>" in text
    tokenized = httpx.post(server.url + "/tokenize", json={"messages": CONVERSATION, "tools": [WEATHER],
                                                           "chat_template_kwargs": kwargs}, timeout=30).json()
    assert tokenized["tokens"] == ids
    r = client.chat.completions.create(model="x", messages=CONVERSATION, tools=[WEATHER], tool_choice="none",
                                       max_tokens=8, temperature=0,
                                       extra_body={"chat_template_kwargs": kwargs, "return_token_ids": True})
    assert r.model_extra["prompt_token_ids"] == ids and r.choices[0].model_extra["token_ids"] == out.outputs[0].token_ids
    assert r.usage.prompt_tokens == len(ids) and r.choices[0].message.content == out.outputs[0].text
    # continue_final_message: the last assistant message is continued, not closed.
    partial = [*ASK, {"role": "assistant", "content": "The weather is"}]
    out = llm.chat(partial, SamplingParams(max_tokens=4, temperature=0), add_generation_prompt=False,
                   continue_final_message=True)[0]
    assert llm.get_tokenizer().decode(out.prompt_token_ids).endswith("The weather is")
    r = client.chat.completions.create(model="x", messages=partial, max_tokens=4, temperature=0,
                                       extra_body={"add_generation_prompt": False, "continue_final_message": True})
    assert r.usage.prompt_tokens == len(out.prompt_token_ids) and r.choices[0].message.content == out.outputs[0].text


# ---- /v1/messages (Anthropic's Messages API) through the official anthropic client ----------------------------
def _anthropic(server):
    import anthropic

    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=120)


def test_messages_text_tools_and_stream(server):
    import anthropic

    client = _anthropic(server)
    tools = [{"name": "get_weather", "description": "The weather", "input_schema": WEATHER["function"]["parameters"]}]
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                                     {"type": "text", "text": "And tomorrow?"}]},
    ]
    script = 'Once more.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
    msg = client.messages.create(model="x", max_tokens=250, system="Be brief.", messages=history, tools=tools,
                                 extra_body={**_script(script), "temperature": 0})
    assert msg.stop_reason == "tool_use" and msg.usage.input_tokens > 0 and msg.usage.output_tokens > 0
    assert [b.type for b in msg.content] == ["text", "tool_use"] and msg.content[0].text == "Once more."
    assert msg.content[1].name == "get_weather" and msg.content[1].input == {"city": "Paris", "days": 2}
    assert msg.content[1].id.startswith("toolu_")
    counted = client.messages.count_tokens(model="x", system="Be brief.", messages=history, tools=tools)
    assert counted.input_tokens == msg.usage.input_tokens
    with client.messages.stream(model="x", max_tokens=250, system="Be brief.", messages=history, tools=tools,
                                extra_body={**_script(script), "temperature": 0}) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(events)
    assert final.stop_reason == "tool_use" and [b.type for b in final.content] == ["text", "tool_use"]
    assert final.content[0].text == "Once more." and final.content[1].input == {"city": "Paris", "days": 2}
    # Thinking, a stop sequence, max_tokens.
    text = "<think>Easy.</think>Four, and that is all."
    msg = client.messages.create(model="x", max_tokens=60, messages=[{"role": "user", "content": "2+2?"}],
                                 stop_sequences=["and that"], extra_body=_script(text))
    assert [b.type for b in msg.content] == ["thinking", "text"] and msg.content[0].thinking == "Easy."
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == "and that" and msg.content[1].text == "Four, "
    with client.messages.stream(model="x", max_tokens=10, messages=[{"role": "user", "content": "2+2?"}],
                                extra_body=_script(text)) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens" and final.content[0].type == "thinking"
    # Errors come in Anthropic's shape.
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="x", max_tokens=10, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
    assert err.value.body["type"] == "error" and "image" in err.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-nope", max_tokens=10, messages=[{"role": "user", "content": "hi"}])


def test_messages_api_key_as_x_api_key_or_bearer(server):
    import anthropic
    import httpx

    body = {"model": "x", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    bearer = httpx.post(server.url + "/v1/messages", headers={"Authorization": f"Bearer {KEY}"}, json=body,
                        timeout=60)
    assert bearer.status_code == 200 and bearer.json()["type"] == "message"
    with pytest.raises(anthropic.AuthenticationError) as err:
        anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0).messages.create(**body)
    assert err.value.body == {"type": "error", "error": {"type": "authentication_error",
                                                         "message": err.value.body["error"]["message"]}}
    assert "x-api-key" in err.value.body["error"]["message"]


def test_messages_tool_choice_forced_and_bad_bodies(server):
    """Anthropic's tool_choice {"type": "tool"} / {"type": "any"} are forced by the grammar (whole and streamed
    through the anthropic client); a malformed body is a 400 in Anthropic's error shape."""
    import anthropic
    import httpx

    client = _anthropic(server)
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Lima"]}}, "required": ["city"],
              "additionalProperties": False}
    tools = [{"name": "get_weather", "input_schema": schema}, {"name": "get_time", "input_schema": schema}]
    ask = [{"role": "user", "content": "Weather?"}]
    msg = client.messages.create(model="x", max_tokens=40, messages=ask, tools=tools,
                                 tool_choice={"type": "tool", "name": "get_time"},
                                 extra_body={"temperature": 0, **NO_THINKING})
    assert msg.stop_reason == "tool_use" and [b.type for b in msg.content] == ["tool_use"]
    assert msg.content[0].name == "get_time" and msg.content[0].input["city"] in ("Paris", "Lima")
    one_of_any = {"type": "any", "disable_parallel_tool_use": True}
    with client.messages.stream(model="x", max_tokens=60, messages=ask, tools=tools, tool_choice=one_of_any,
                                extra_body={"temperature": 0, **NO_THINKING}) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[0].type == "tool_use"
    assert final.content[0].name in ("get_weather", "get_time") and final.content[0].input["city"] in ("Paris", "Lima")
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="x", max_tokens=5, messages=ask, tools=tools, tool_choice={"type": "sometimes"})
    error = err.value.body["error"]
    assert error["type"] == "invalid_request_error" and "tool_choice" in error["message"]
    bad = httpx.post(server.url + "/v1/messages", headers={"x-api-key": KEY}, json={"model": "x", "messages": ask},
                     timeout=30)
    assert bad.status_code == 400 and bad.json()["type"] == "error"
    assert bad.json()["error"]["type"] == "invalid_request_error" and "max_tokens" in bad.json()["error"]["message"]


# The id check of Mistral's published templates (tool calls and tool results), trimmed to what matters here.
MISTRAL_IDS = """{%- for message in messages %}
{%- if message.tool_calls %}{% for tool_call in message.tool_calls %}
{%- if not tool_call.id is defined or tool_call.id|length != 9 %}
{{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}{% endif %}
{{- "[TOOL_CALLS]" + tool_call.id }}{% endfor %}
{%- elif message.role == "tool" %}
{%- if message.tool_call_id is not defined or message.tool_call_id|length != 9 %}
{{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}{% endif %}
{{- "[TOOL_RESULTS]" + message.tool_call_id }}
{%- else %}{{ message.content }}{% endif %}{% endfor %}"""


def test_mistral_template_gets_nine_character_tool_call_ids(server):
    """OpenAI-style ids ("call_...", as wslm and OpenAI hand out) reach a Mistral template as 9 alphanumeric
    characters, the same for a call and its result, so a tool round-trip does not fail inside the template."""
    import httpx

    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "x", "messages": _history(), "chat_template": MISTRAL_IDS, "add_generation_prompt": False}
    r = httpx.post(server.url + "/tokenize", json=body, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    text = httpx.post(server.url + "/detokenize", json={"tokens": r.json()["tokens"]}, headers=headers,
                      timeout=30).json()["prompt"]
    call_id = text.split("[TOOL_CALLS]")[1][:9]
    assert call_id.isalnum() and f"[TOOL_RESULTS]{call_id}" in text


SHOWS_REASONING = ("{% for m in messages %}[{{ m.role }}]{% if m.reasoning_content %}<think>{{ m.reasoning_content }}"
                   "</think>{% endif %}{{ m.content }}{% endfor %}")


def test_reasoning_in_history_reaches_the_template_and_null_fields(server, client):
    """Earlier reasoning a client sends back (reasoning_content, or Anthropic thinking blocks) reaches the
    template, which decides whether to show it (Qwen3's does inside a tool loop); "n": null and "echo": null,
    which OpenAI's spec allows, mean their defaults."""
    import httpx

    headers = {"Authorization": f"Bearer {KEY}"}
    turn = [*ASK, {"role": "assistant", "content": "Sunny.", "reasoning_content": "Look it up."}]
    ids = httpx.post(server.url + "/tokenize", headers=headers, timeout=30,
                     json={"messages": turn, "chat_template": SHOWS_REASONING,
                           "add_generation_prompt": False}).json()["tokens"]
    text = httpx.post(server.url + "/detokenize", headers=headers, json={"tokens": ids}, timeout=30).json()["prompt"]
    assert text.endswith("[assistant]<think>Look it up.</think>Sunny.")
    anthropic_client = _anthropic(server)
    counts = [anthropic_client.messages.count_tokens(
        model="x", extra_body={"chat_template": SHOWS_REASONING},
        messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [
            *thought, {"type": "text", "text": "Sunny."}]}]).input_tokens
        for thought in ([], [{"type": "thinking", "thinking": "Look it up.", "signature": ""}])]
    assert counts[1] > counts[0]
    # Anthropic's prefill: a final assistant message is continued, not closed.
    prefill = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "The weather is"}]
    continued = httpx.post(server.url + "/tokenize", headers=headers, timeout=30,
                           json={"messages": prefill, "add_generation_prompt": False,
                                 "continue_final_message": True}).json()["count"]
    assert anthropic_client.messages.count_tokens(model="x", messages=prefill).input_tokens == continued
    r = client.chat.completions.create(model="x", messages=ASK, n=None, max_tokens=2)
    assert len(r.choices) == 1
    r = client.completions.create(model="x", prompt="Hello", echo=None, max_tokens=2)
    assert not r.choices[0].text.startswith("Hello")


def test_json_output_from_a_reasoning_server(client):
    """The qwen3 parser is on: the JSON constraint applies after any think block (engine-level test:
    test_engine_structured.py), and with enable_thinking false straight away; the reply's JSON is content."""
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Lima"]}}, "required": ["city"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}
    r = client.chat.completions.create(model="x", messages=ASK, response_format=fmt, max_tokens=30, temperature=0,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.reasoning_content is None
    assert json.loads(r.choices[0].message.content)["city"] in ("Paris", "Lima")
    r = client.chat.completions.create(model="x", messages=ASK, response_format=fmt, max_tokens=30, temperature=0)
    if r.choices[0].finish_reason == "stop":  # a random model may also think until max_tokens
        assert json.loads(r.choices[0].message.content)["city"] in ("Paris", "Lima")


def test_tool_history_renders_through_a_harmony_template(server):
    """gpt-oss's template renders one call per assistant message and names each tool result after the latest
    call: an OpenAI client's parallel calls, its results (out of order) and its reasoning_content reach it, via
    the request path, as the model wrote them (tests/test_harmony.py has the template's part and the text)."""
    import httpx
    from test_harmony import HARMONY_TEMPLATE, HISTORY, RENDERED

    headers = {"Authorization": f"Bearer {KEY}"}
    ids = httpx.post(server.url + "/tokenize", headers=headers, timeout=30,
                     json={"messages": HISTORY, "chat_template": HARMONY_TEMPLATE}).json()["tokens"]
    text = httpx.post(server.url + "/detokenize", headers=headers, json={"tokens": ids}, timeout=30).json()["prompt"]
    assert text == RENDERED
