"""Structured output and the sampling extras through the official openai client on one real `wslm serve`
(demo model, float32): response_format json_schema/json_object, structured_outputs, guided_* extras, n > 1,
streaming, invalid constraints, logit_bias, allowed_token_ids, bad_words, prompt logprobs, echo, token ids."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import jsonschema
import openai
import pytest
from test_server_helpers import SMALL, ServerProcess

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "enum": ["Paris", "Lima", "Oslo"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe a person as JSON with a name, an age and a city."}]


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--port", "0", *SMALL, "--dtype", "float32", "--max-num-seqs", "32", "--max-logprobs", "-1")
    yield srv
    assert srv.stop() == 0, srv.stderr()[-3000:]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=180)


def test_json_schema_valid_over_20_seeds(server):
    async def run() -> list:
        aclient = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=180)
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
        calls = [aclient.chat.completions.create(model="demo", messages=ASK, response_format=fmt, seed=seed,
                                                 temperature=1.0, max_tokens=120) for seed in range(20)]
        try:
            return await asyncio.gather(*calls)
        finally:
            await aclient.close()

    replies = asyncio.run(run())
    texts = set()
    for r in replies:
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), PERSON)
        texts.add(choice.message.content)
    assert len(texts) > 5  # sampled, not one forced string


def test_json_object_and_guided_json_extra(client):
    r = client.chat.completions.create(model="demo", messages=ASK, response_format={"type": "json_object"},
                                       max_tokens=150, temperature=0)
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4}
    r = client.completions.create(model="demo", prompt="Some numbers:", max_tokens=60, temperature=0,
                                  extra_body={"guided_json": schema})
    jsonschema.validate(json.loads(r.choices[0].text), schema)


def test_regex_choice_and_grammar(client):
    r = client.completions.create(model="demo", prompt="The date today is", max_tokens=20, temperature=0.8, seed=3,
                                  extra_body={"structured_outputs": {"regex": r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"}})
    assert re.fullmatch(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]", r.choices[0].text) and r.choices[0].finish_reason == "stop"
    r = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "Is the sky blue?"}],
                                       max_tokens=10, extra_body={"guided_choice": ["yes", "no", "maybe"]})
    assert r.choices[0].message.content in ("yes", "no", "maybe")
    r = client.completions.create(model="demo", prompt="Hex:", max_tokens=12, temperature=0,
                                  extra_body={"guided_grammar": 'root ::= "0x" [0-9a-f]{1,6} ";"'})
    assert re.fullmatch(r"0x[0-9a-f]{1,6};", r.choices[0].text)


def test_grammar_with_n_stream_and_penalties(client):
    choices = ["red", "green", "blue", "yellow"]
    r = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "Pick a colour."}],
                                       n=4, seed=1, temperature=1.2, presence_penalty=1.0, max_tokens=8,
                                       extra_body={"guided_choice": choices})
    assert len(r.choices) == 4 and all(c.message.content in choices for c in r.choices)
    stream = client.completions.create(model="demo", prompt="My phone number is", max_tokens=20, stream=True,
                                       temperature=0.7, seed=5, n=2,
                                       extra_body={"guided_regex": r"\d{3}-\d{3}-\d{4}", "repetition_penalty": 1.3})
    texts, finish = {0: "", 1: ""}, {}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.text
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert all(re.fullmatch(r"\d{3}-\d{3}-\d{4}", t) for t in texts.values()), texts
    assert finish == {0: "stop", 1: "stop"}


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wat"}}}},
         "response_format", "Unsupported type"),
        ({"guided_regex": "a(b"}, "guided_regex", "parenthesis"),
        ({"guided_regex": "a{100000}"}, "guided_regex", "limit of 1000"),
        ({"guided_json": {"type": "object"}, "guided_whitespace_pattern": " *"}, "guided_json", "whitespace_pattern"),
        ({"structured_outputs": {"grammar": "root ::= nothing"}}, "structured_outputs", "not defined"),
        ({"guided_choice": []}, "guided_choice", "non-empty"),
        ({"guided_json": {"type": "object"}, "guided_regex": "a"}, "guided_regex", "Only one"),
        ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
        ({"use_beam_search": True, "response_format": {"type": "json_object"}}, "response_format", "beam search"),
    ],
)
def test_invalid_constraints_are_400(client, body, param, words):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="demo", messages=ASK, max_tokens=5, extra_body=body)
    error = err.value.body
    assert error["param"] == param and words in error["message"], error


def _token(server, text: str) -> int:
    ids = httpx.post(server.url + "/tokenize", json={"prompt": text, "add_special_tokens": False}).json()["tokens"]
    assert len(ids) == 1, ids
    return ids[0]


def test_logit_bias_forces_and_forbids(server, client):
    prompt = "The capital of France is"
    base = client.completions.create(model="demo", prompt=prompt, max_tokens=3, temperature=0,
                                     extra_body={"return_token_ids": True}).choices[0]
    banana = _token(server, " banana")
    r = client.completions.create(model="demo", prompt=prompt, max_tokens=3, temperature=0.8, seed=4,
                                  logit_bias={str(banana): 100}, extra_body={"return_token_ids": True})
    assert r.choices[0].token_ids == [banana] * 3 and r.choices[0].text == " banana" * 3
    first = base.token_ids[0]
    r = client.completions.create(model="demo", prompt=prompt, max_tokens=3, temperature=0,
                                  logit_bias={str(first): -100}, extra_body={"return_token_ids": True})
    assert first not in r.choices[0].token_ids
    for bias, words in (({str(banana): 250}, "[-100, 100]"), ({"99999999": 1}, "out of range"),
                        ({"x": 1}, "token ids")):
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model="demo", prompt=prompt, max_tokens=2, logit_bias=bias)
        assert err.value.body["param"] == "logit_bias" and words in err.value.body["message"]
    yes, no = _token(server, " yes"), _token(server, " no")
    r = client.completions.create(model="demo", prompt=prompt, max_tokens=4, seed=1,
                                  extra_body={"allowed_token_ids": [yes, no], "return_token_ids": True})
    assert set(r.choices[0].token_ids) <= {yes, no}
    r = client.completions.create(model="demo", prompt=prompt, max_tokens=6, temperature=0,
                                  extra_body={"bad_words": ["Paris"]})
    assert "Paris" in base.text + client.completions.create(model="demo", prompt=prompt, max_tokens=6,
                                                            temperature=0).choices[0].text
    assert "Paris" not in r.choices[0].text


def test_echo_logprobs_prompt_logprobs_token_ids(server, client):
    prompt = "Water boils at one hundred degrees"
    r = client.completions.create(model="demo", prompt=prompt, max_tokens=3, temperature=0, echo=True, logprobs=2,
                                  extra_body={"prompt_logprobs": 2, "return_token_ids": True})
    c = r.choices[0]
    prompt_ids = c.model_extra["prompt_token_ids"]
    lp = c.logprobs
    assert c.text.startswith(prompt) and len(lp.tokens) == len(prompt_ids) + 3
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    plp = c.model_extra["prompt_logprobs"]
    assert plp[0] is None and len(plp) == len(prompt_ids)
    for pos in range(1, len(prompt_ids)):
        own = plp[pos][str(prompt_ids[pos])]
        assert lp.token_logprobs[pos] == pytest.approx(own["logprob"], abs=1e-5) and own["rank"] >= 1
        assert len(lp.top_logprobs[pos]) >= 2
    # Streamed: the echo (with its logprobs) comes first, then the same tokens.
    stream = client.completions.create(model="demo", prompt=prompt, max_tokens=3, temperature=0, echo=True,
                                       logprobs=2, stream=True)
    tokens, text = [], ""
    for chunk in stream:
        for ch in chunk.choices:
            text += ch.text
            if ch.logprobs:
                tokens += ch.logprobs.tokens
    assert text == c.text and tokens == lp.tokens
    # Chat: prompt_logprobs and prompt_token_ids at the top level; token ids as strings on request.
    msgs = [{"role": "user", "content": "Hi!"}]
    r = client.chat.completions.create(model="demo", messages=msgs, max_tokens=3, temperature=0, logprobs=True,
                                       top_logprobs=1, extra_body={"prompt_logprobs": 0, "return_token_ids": True,
                                                                   "return_tokens_as_token_ids": True})
    extra = r.model_extra
    assert len(extra["prompt_logprobs"]) == len(extra["prompt_token_ids"])
    ids = r.choices[0].model_extra["token_ids"]
    assert [t.token for t in r.choices[0].logprobs.content] == [f"token_id:{t}" for t in ids]
    stream = client.chat.completions.create(model="demo", messages=msgs, max_tokens=3, temperature=0, stream=True,
                                            extra_body={"return_token_ids": True})
    streamed = [t for chunk in stream for ch in chunk.choices for t in (ch.model_extra.get("token_ids") or [])]
    assert streamed == ids
    # truncate_prompt_tokens keeps the last k tokens.
    r = client.completions.create(model="demo", prompt="one two three four five six seven", max_tokens=2,
                                  extra_body={"truncate_prompt_tokens": 3})
    assert r.usage.prompt_tokens == 3


def test_top_logprobs_whole_vocabulary(client):
    # --max-logprobs -1 lets a request ask for every token's logprob (vLLM's top_logprobs=-1).
    r = client.chat.completions.create(model="demo", messages=ASK, max_tokens=1, temperature=0, logprobs=True,
                                       top_logprobs=-1)
    top = r.choices[0].logprobs.content[0].top_logprobs
    assert len(top) == 49152 and top[0].logprob >= top[-1].logprob


# Shaped as pydantic writes tool schemas (LangChain, the OpenAI SDK): a `$defs` entry behind a `$ref`.
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "$defs": {"Unit": {"type": "string", "enum": ["C", "F"]}},
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"$ref": "#/$defs/Unit"}},
    "required": ["city", "unit"], "additionalProperties": False}}}


def test_tool_choice_required_valid_arguments_over_20_seeds(server):
    """tool_choice="required" on the demo model: the grammar makes every reply a call whose arguments are valid
    JSON for the tool's schema (the demo template has no tool format: "auto" would be a 400)."""
    async def run() -> list:
        aclient = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=180)
        ask = [{"role": "user", "content": "What is the weather in Paris?"}]
        calls = [aclient.chat.completions.create(model="demo", messages=ask, tools=[WEATHER_TOOL], seed=seed,
                                                 tool_choice="required", parallel_tool_calls=False,
                                                 temperature=1.0, max_tokens=60)
                 for seed in range(20)]
        try:
            return await asyncio.gather(*calls)
        finally:
            await aclient.close()

    for r in asyncio.run(run()):
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        for call in choice.message.tool_calls:
            assert call.function.name == "get_weather" and call.id.startswith("call_")
            jsonschema.validate(json.loads(call.function.arguments), WEATHER_TOOL["function"]["parameters"])
