"""vLLM's OpenAI-server behaviours that clients use (issue 26 item 3), checked the way vLLM's own tests check
them (tests/entrypoints/openai/... and tests/entrypoints/serve/...): logprob_token_ids, return_token_ids and
return_tokens_as_token_ids (streamed too, emoji split across tokens), prompt_logprobs next to logprobs,
/tokenizer_info, /version, /load, force-included usage, empty prompts and out-of-vocabulary ids (400),
truncation sides, named and required tool_choice with max_tokens, --root-path with an API key, and the
/v1/models card. One real `wslm serve` process on the demo model (the model vLLM's tokenization tests use),
driven by the official openai client and httpx."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest
from test_server_helpers import SMALL, ServerProcess

KEY = "sk-parity"
AUTH = {"Authorization": f"Bearer {KEY}"}
ROOT = "/llm"


@pytest.fixture(scope="module")
def server():
    # The key from vLLM's environment variable, as a vLLM launch script sets it.
    srv = ServerProcess("demo", "--port", "0", *SMALL, "--root-path", ROOT, "--enable-server-load-tracking",
                        "--enable-tokenizer-info-endpoint", "--enable-force-include-usage", env={"VLLM_API_KEY": KEY})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + ROOT + "/v1", api_key=KEY, max_retries=0)


class ServerTokenizer:
    """The model's tokenizer through the server's /tokenize and /detokenize (loading it here would cost the
    test process seconds of CPU)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def encode(self, text: str) -> list[int]:
        return httpx.post(self.url + "/tokenize", json={"prompt": text}).json()["tokens"]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        text = httpx.post(self.url + "/detokenize", json={"tokens": ids}).json()["prompt"]
        return text.replace("<|im_end|>", "").replace("<|endoftext|>", "") if skip_special_tokens else text


@pytest.fixture(scope="module")
def tok(server):
    return ServerTokenizer(server.url)


def _token_ids(strs: list[str]) -> list[int]:
    assert all(s.startswith("token_id:") for s in strs), strs
    return [int(s.removeprefix("token_id:")) for s in strs]


# ---- logprob_token_ids (vLLM's test_logprob_token_ids.py / _validation.py) ----------------------------------

def test_logprob_token_ids_report_the_requested_ids(client):
    wanted = [100, 1000, 5000]
    r = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "Hello"}], max_tokens=2,
                                       temperature=0, logprobs=True, top_logprobs=len(wanted),
                                       extra_body={"logprob_token_ids": wanted, "return_tokens_as_token_ids": True})
    for entry in r.choices[0].logprobs.content:
        returned = _token_ids([e.token for e in entry.top_logprobs])
        sampled = int(entry.token.removeprefix("token_id:"))
        assert set(returned) == set(wanted) | {sampled}
        assert all(-9999.0 <= e.logprob <= 0.0 for e in entry.top_logprobs)
    plain = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "Hello"}],
                                           max_tokens=1, temperature=0, logprobs=True, top_logprobs=5)
    assert len(plain.choices[0].logprobs.content[0].top_logprobs) == 5  # the default path is unchanged
    # Completions: the requested ids (and the sampled one) are each token's top_logprobs.
    c = client.completions.create(model="demo", prompt="The sky is", max_tokens=2, temperature=0, logprobs=0,
                                  extra_body={"logprob_token_ids": wanted})
    for token, top in zip(c.choices[0].logprobs.tokens, c.choices[0].logprobs.top_logprobs, strict=True):
        assert next(iter(top)) == token and len(top) >= len(wanted)


@pytest.mark.parametrize("extra, words", [
    ({"logprob_token_ids": [], "logprobs": True}, "must not be an empty list"),
    ({"logprob_token_ids": [100]}, "when using `logprob_token_ids`"),
    ({"logprob_token_ids": [10**7], "logprobs": True}, "out of vocabulary"),
])
def test_logprob_token_ids_validation(client, extra, words):
    with pytest.raises(openai.BadRequestError, match=words) as err:
        client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=1,
                                       extra_body=extra)
    assert err.value.body["param"] == "logprob_token_ids"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="demo", prompt="hi", max_tokens=1, extra_body={"logprob_token_ids": "1"})


# ---- return_token_ids / return_tokens_as_token_ids (test_return_token_ids.py, test_return_tokens_as_ids.py) ----

def test_completion_token_ids_with_emoji(client, tok):
    prompt = "Complete this sentence with emojis: I love coding 🚀"
    c = client.completions.create(model="demo", prompt=prompt, max_tokens=10, temperature=0, logprobs=1,
                                  extra_body={"return_token_ids": True})
    choice = c.choices[0]
    assert choice.prompt_token_ids == tok.encode(prompt) and choice.token_ids
    assert tok.decode(choice.token_ids).startswith(choice.text)
    without = client.completions.create(model="demo", prompt=prompt, max_tokens=2, temperature=0)
    assert without.choices[0].model_dump().get("token_ids") is None
    assert without.choices[0].model_dump().get("prompt_token_ids") is None


def test_tokens_as_ids_with_echo_match_token_ids_and_prompt_logprobs(client, tok):
    c = client.completions.create(model="demo", prompt="Say 'Hello, world! 🎉'", echo=True, max_tokens=10,
                                  temperature=0, logprobs=1,
                                  extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True,
                                              "prompt_logprobs": 1})
    choice = c.choices[0]
    strs = choice.logprobs.tokens
    # The first key of each top_logprobs entry is that position's own token (the prompt's first has none).
    assert strs[1:] == [next(iter(top)) for top in choice.logprobs.top_logprobs[1:]]
    ids = _token_ids(strs)
    assert ids == choice.prompt_token_ids + choice.token_ids
    assert choice.text == tok.decode(ids, skip_special_tokens=True).rstrip("\ufffd")
    assert choice.prompt_logprobs[0] is None and len(choice.prompt_logprobs) == len(choice.prompt_token_ids)
    assert all(f"{t}" in entry for t, entry in zip(choice.prompt_token_ids[1:], choice.prompt_logprobs[1:]))


def test_completion_stream_carries_ids_and_logprobs_on_every_chunk(client):
    stream = client.completions.create(model="demo", prompt="Tell me a short fact about Python:", max_tokens=12,
                                       temperature=0, stream=True, logprobs=1,
                                       extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True})
    prompt_ids, ids, logprob_ids, finishes = None, [], [], []
    for chunk in stream:
        if not chunk.choices:  # --enable-force-include-usage: the closing usage chunk
            assert chunk.usage.completion_tokens == len(ids)
            continue
        choice = chunk.choices[0]
        logprob_ids += _token_ids(choice.logprobs.tokens)
        if prompt_ids is None:
            prompt_ids = choice.prompt_token_ids
        ids += choice.token_ids
        finishes.append(choice.finish_reason)
    assert prompt_ids and ids == logprob_ids and len(ids) == 12
    assert finishes[-1] == "length" and finishes.count("length") == 1


def test_chat_token_ids_and_tokens_as_ids_stream_and_whole(client, tok):
    messages = [{"role": "system", "content": "You like to use emojis in your responses."},
                {"role": "user", "content": "Repeat after me: I love cats 🐱"}]
    r = client.chat.completions.create(model="demo", messages=messages, max_tokens=12, temperature=0, logprobs=True,
                                       extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True})
    assert "I love cats 🐱" in tok.decode(r.prompt_token_ids)
    ids = _token_ids([e.token for e in r.choices[0].logprobs.content])
    assert ids == r.choices[0].token_ids
    assert tok.decode(ids, skip_special_tokens=True).rstrip("\ufffd") == r.choices[0].message.content
    stream = client.chat.completions.create(model="demo", messages=messages, max_tokens=12, temperature=0,
                                            stream=True, extra_body={"return_token_ids": True})
    content, streamed = "", []
    for n, chunk in enumerate(stream):
        dump = chunk.model_dump()
        if n == 0:
            assert chunk.prompt_token_ids == r.prompt_token_ids  # the first chunk only, at its top level
        else:
            assert "prompt_token_ids" not in dump
        if chunk.choices:
            content += chunk.choices[0].delta.content or ""
            if "token_ids" in chunk.choices[0].model_dump():
                streamed.extend(chunk.choices[0].token_ids)
    assert content == r.choices[0].message.content and streamed == r.choices[0].token_ids


def test_prompt_logprobs_next_to_logprobs(client):
    r = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "Hi there"}],
                                       max_tokens=2, logprobs=True, top_logprobs=2,
                                       extra_body={"prompt_logprobs": 2})
    assert r.prompt_logprobs[0] is None and all(len(e) >= 2 for e in r.prompt_logprobs[1:])
    assert len(r.choices[0].logprobs.content[0].top_logprobs) == 2
    c = client.completions.create(model="demo", prompt="Hi there, friend", max_tokens=2, logprobs=1,
                                  extra_body={"prompt_logprobs": 0})
    plp = c.choices[0].prompt_logprobs
    assert plp[0] is None and all(len(e) >= 1 for e in plp[1:]) and len(c.choices[0].logprobs.tokens) == 2
    with pytest.raises(openai.BadRequestError, match="prompt_logprobs"):
        client.completions.create(model="demo", prompt="Hi", max_tokens=1, extra_body={"prompt_logprobs": -2})


# ---- prompts the engine cannot take (test_prompt_validation.py, test_empty_prompt_list.py) ---------------------

@pytest.mark.parametrize("body, words", [
    ({"prompt": ""}, "empty"),
    ({"prompt": []}, "Either prompt or prompt_embeds must be provided and non-empty"),
    ({"prompt_embeds": []}, "Either prompt or prompt_embeds must be provided and non-empty"),
    ({"prompt": ["fine", ""]}, "empty"),
    ({"prompt": [999999]}, "out of vocabulary.*49152"),
    ({"prompt": [[1, 2], [3, 10**6]]}, "Token id 1000000 is out of vocabulary"),
])
def test_bad_prompts_are_400(client, body, words):
    with pytest.raises(openai.BadRequestError, match=words) as err:
        client.completions.create(model="demo", max_tokens=2, prompt=body.get("prompt"),
                                  extra_body={k: v for k, v in body.items() if k != "prompt"})
    assert err.value.body["param"] == "prompt"


# ---- truncation sides ------------------------------------------------------------------------------------------

def test_truncate_prompt_tokens_and_truncation_side(client, tok):
    ids = tok.encode("one two three four five six")
    kept = {}
    for side in (None, "left", "right"):
        extra = {"truncate_prompt_tokens": 3, "return_token_ids": True}
        if side:
            extra["truncation_side"] = side
        c = client.completions.create(model="demo", prompt="one two three four five six", max_tokens=1,
                                      extra_body=extra)
        kept[side] = c.choices[0].prompt_token_ids
        assert c.usage.prompt_tokens == 3
    assert kept[None] == kept["left"] == ids[-3:] and kept["right"] == ids[:3]
    chat = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "a b c d e f"}],
                                          max_tokens=1, extra_body={"truncate_prompt_tokens": 4,
                                                                    "truncation_side": "right",
                                                                    "return_token_ids": True})
    assert chat.usage.prompt_tokens == 4 and len(chat.prompt_token_ids) == 4
    with pytest.raises(openai.BadRequestError, match="truncation_side"):
        client.completions.create(model="demo", prompt="hi", max_tokens=1, extra_body={"truncation_side": "middle"})


# ---- tools (test_completion_with_function_calling.py) ----------------------------------------------------------

WEATHER = {"type": "function", "function": {
    "name": "get_current_weather", "description": "Get the current weather in a given location",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
ASK = [{"role": "user", "content": "What is the weather in Berlin, in fahrenheit?"}]
NAMED = {"type": "function", "function": {"name": "get_current_weather"}}


@pytest.mark.parametrize("tool_choice", ["required", NAMED])
def test_max_tokens_cutting_a_forced_tool_call(client, tool_choice):
    r = client.chat.completions.create(model="demo", messages=ASK, tools=[WEATHER], tool_choice=tool_choice,
                                       max_completion_tokens=1, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls is None and choice.message.content == ""


def test_named_tool_use_whole_and_streamed(client):
    r = client.chat.completions.create(model="demo", messages=ASK, tools=[WEATHER], tool_choice=NAMED,
                                       max_completion_tokens=60, temperature=0)
    message = r.choices[0].message
    assert message.content == "" and r.choices[0].finish_reason == "stop"  # OpenAI's for a named function
    args = json.loads(message.tool_calls[0].function.arguments)
    assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")
    pieces, finishes = [], 0
    for chunk in client.chat.completions.create(model="demo", messages=ASK, tools=[WEATHER], tool_choice=NAMED,
                                                max_completion_tokens=60, temperature=0, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        assert delta.role in (None, "assistant") and not delta.content
        if delta.tool_calls and delta.tool_calls[0].function.arguments:
            pieces.append(delta.tool_calls[0].function.arguments)
        finishes += chunk.choices[0].finish_reason is not None
    assert finishes == 1 and json.loads("".join(pieces)) == args
    for bad in ({"tool_choice": NAMED},  # no tools
                {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nondefined"}}},
                {"tools": [WEATHER], "tool_choice": {}}):
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="demo", messages=ASK, max_completion_tokens=5, **bad)


# ---- usage, load, version, tokenizer info, models, root path + key ---------------------------------------------

def test_force_include_usage_on_every_chunk(client):
    last = 0
    chunks = list(client.chat.completions.create(model="demo", messages=ASK, max_completion_tokens=6, temperature=0,
                                                 stream=True, extra_body={"min_tokens": 6}))
    for chunk in chunks:
        usage = chunk.usage
        assert usage.prompt_tokens > 0 and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
        assert last == 0 or usage.completion_tokens > last or (not chunk.choices and usage.completion_tokens == last)
        last = usage.completion_tokens
    assert last == 6 and not chunks[-1].choices
    whole = client.chat.completions.create(model="demo", messages=ASK, max_completion_tokens=2)
    assert whole.usage.completion_tokens == 2


def test_server_load_counts_requests_in_flight(server):
    base = server.url
    assert httpx.get(base + "/load").json() == {"server_load": 0}
    body = {"model": "demo", "prompt": "Give me a long story", "max_tokens": 16, "ignore_eos": True}
    answers: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: answers.append(
        httpx.post(base + "/v1/completions", json=body, headers=AUTH, timeout=120)))
    worker.start()
    seen = set()
    while worker.is_alive():
        seen.add(httpx.get(base + ROOT + "/load").json()["server_load"])
        time.sleep(0.02)  # leave the cores to the request being counted
    worker.join()
    assert answers[0].status_code == 200 and 1 in seen and seen <= {0, 1}
    assert httpx.get(base + "/load").json() == {"server_load": 0}


def test_version_health_and_tokenizer_info(server):
    from wslm import __version__

    for prefix in ("", ROOT):
        assert httpx.get(server.url + prefix + "/version").json() == {"version": __version__}
        assert httpx.get(server.url + prefix + "/health").status_code == 200
    info = httpx.get(server.url + "/tokenizer_info").json()
    assert isinstance(info["tokenizer_class"], str) and info["tokenizer_class"]
    types = {"add_bos_token": bool, "add_prefix_space": bool, "clean_up_tokenization_spaces": bool,
             "split_special_tokens": bool, "bos_token": str, "eos_token": str, "pad_token": str,
             "unk_token": str, "chat_template": str, "errors": str, "model_max_length": int,
             "additional_special_tokens": list, "added_tokens_decoder": dict}
    for field, kind in types.items():
        assert info.get(field) is None or isinstance(info[field], kind), field
    assert info["chat_template"].strip()
    tokenized = httpx.post(server.url + "/tokenize", json={"model": "demo", "prompt": "Hello world!"}).json()
    assert info["model_max_length"] >= tokenized["max_model_len"] == 1024


def test_models_card_fields(client):
    card = client.models.list().data[0]
    assert (card.id, card.object, card.owned_by, card.root, card.parent) == ("demo", "model", "wslm", "demo", None)
    assert card.max_model_len == 1024 and isinstance(card.created, int)
    perm = card.permission[0]
    assert perm["object"] == "model_permission" and perm["allow_sampling"] and perm["allow_logprobs"]
    assert not perm["allow_fine_tuning"] and perm["organization"] == "*"
    assert client.models.retrieve("demo").permission


@pytest.mark.parametrize("prefix", ["", ROOT])
def test_root_path_with_api_key(server, prefix):
    saying = "Here is a common saying about apple. An apple a day, keeps"
    messages = [{"role": "user", "content": "tell me a common saying"}, {"role": "assistant", "content": saying}]
    wrong = openai.OpenAI(base_url=server.url + prefix + "/v1", api_key="abc", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model="demo", messages=messages, max_tokens=3)
    right = openai.OpenAI(base_url=server.url + prefix + "/v1", api_key=KEY, max_retries=0)
    r = right.chat.completions.create(model="demo", messages=messages, max_tokens=3,
                                      extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    wrong_type = httpx.post(server.url + prefix + "/v1/chat/completions", content="messages=hi", headers={
        **AUTH, "Content-Type": "application/x-www-form-urlencoded"})
    assert wrong_type.status_code == 400
