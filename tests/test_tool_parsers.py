"""The tool-call and reasoning parsers on their own (the server tests drive them with real model output): any
split of a reply into streamed pieces gives the same calls, content and reasoning as the whole reply, and text
that only looks like a call stays content."""

from __future__ import annotations

import json

import pytest

from wslm.backend.entrypoints.openai.chat_reply import ChatReply
from wslm.backend.entrypoints.openai.reasoning import (
    get_reasoning_parser,
    pick_reasoning_parser,
    prompt_opens_think,
)
from wslm.backend.entrypoints.openai.tool_parsers import (
    ArrayToolParser,
    NamedFunctionParser,
    get_tool_parser,
    pick_tool_parser,
)

CALLS = [("get_weather", {"city": "Pa\"ris", "days": [1, 2]}), ("get_time", {})]
REPLIES = {
    "hermes": 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\"ris", "days": [1, 2]}}\n'
              '</tool_call>\n<tool_call>{"arguments": {}, "name": "get_time"}</tool_call>',
    "mistral": 'Sure.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Pa\\"ris", "days": [1,2]}}, '
               '{"name": "get_time", "arguments": {}}]',
    "llama3_json": '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Pa\\"ris", "days": [1, 2]}}; '
                   '{"name": "get_time", "parameters": {}}',
    "pythonic": '[get_weather(city=\'Pa"ris\', days=[1, 2]), get_time()]',
    "qwen3_coder": 'Sure.<tool_call>\n<function=get_weather>\n<parameter=city>\nPa"ris\n</parameter>\n'
                   '<parameter=days>\n[1, 2]\n</parameter>\n</function>\n</tool_call>\n'
                   '<tool_call>\n<function=get_time>\n</function>\n</tool_call>',
}
# The request's tools (qwen3_coder types its raw text values by them; the JSON formats ignore them).
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "array", "items": {"type": "integer"}}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]


def _streamed(reply: ChatReply, text: str, step: int) -> tuple[str, str, list[tuple[str, str]]]:
    deltas = []
    for i in range(0, len(text), step):
        deltas += reply.feed(text[i:i + step], final=False)
    deltas += reply.feed("", final=True)
    content = "".join(d.get("content", "") for d in deltas)
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    calls: dict[int, list] = {}
    for d in deltas:
        for tc in d.get("tool_calls", []):
            if "id" in tc:
                assert tc["index"] not in calls and tc["id"].startswith("call_") and tc["function"]["arguments"] == ""
                calls[tc["index"]] = [tc["function"]["name"], ""]
            calls[tc["index"]][1] += tc["function"].get("arguments", "")
    return content, reasoning, [tuple(c) for c in calls.values()]


@pytest.mark.parametrize("fmt", list(REPLIES))
@pytest.mark.parametrize("step", [1, 2, 7, 10_000])
def test_streamed_pieces_join_into_the_whole_reply(fmt, step):
    whole = ChatReply(None, get_tool_parser(fmt, TOOLS))
    whole.feed(REPLIES[fmt], final=True)
    msg = whole.message()
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg["tool_calls"]] == CALLS
    assert msg["content"] == ("Sure." if fmt in ("hermes", "mistral", "qwen3_coder") else None)
    assert whole.finish_reason("stop") == "tool_calls" and whole.finish_reason("length") == "length"
    content, _, calls = _streamed(ChatReply(None, get_tool_parser(fmt, TOOLS)), REPLIES[fmt], step)
    assert (content or None) == msg["content"]
    assert calls == [(c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]]


@pytest.mark.parametrize(("fmt", "text"), [
    ("hermes", "Plain text, then a half marker <tool_"), ("hermes", "<tool_call>not json</tool_call>"),
    ("mistral", "[1] first point"), ("mistral", "Text [TOOL_CALLS"), ("llama3_json", "Hello {there}"),
    ("llama3_json", "<|python"), ("pythonic", "[1] a list"), ("pythonic", "[unclosed(x=1)"),
    ("qwen3_coder", "<tool_call>\nnot a function</tool_call>"), ("qwen3_coder", "Half a marker <tool_c"),
])
def test_text_that_is_not_a_call_stays_content(fmt, text):
    for step in (1, 3, len(text)):
        reply = ChatReply(None, get_tool_parser(fmt))
        content, _, calls = _streamed(reply, text, step)
        assert content == text and calls == [] and not reply.called_tools


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), [
    # Cut inside the arguments: the call stays with what was written (OpenAI's shape for finish "length").
    ("hermes", 'Hi<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', "Hi",
     [("get_weather", '{"city": "Pa')]),
    ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"x": [1, ', None, [("f", '{"x": [1, ')]),
    ("llama3_json", '{"name": "f", "parameters": {"q": "a', None, [("f", '{"q": "a')]),
    ("qwen3_coder", 'Hi<tool_call>\n<function=f>\n<parameter=a>\nx\n</parameter>\n<parameter=b>\nhal', "Hi",
     [("f", '{"a": "x"')]),
    # Cut before any call's name was whole: nothing is lost, the text is content.
    ("hermes", 'Hi<tool_call>\n{"name": "get_wea', 'Hi<tool_call>\n{"name": "get_wea', []),
    ("llama3_json", '{"na', '{"na', []),
])
def test_a_reply_cut_short_loses_nothing(fmt, text, content, calls):
    whole = ChatReply(None, get_tool_parser(fmt))
    whole.feed(text, final=True)
    msg = whole.message()
    assert msg["content"] == content
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls", [])] == calls
    assert whole.finish_reason("length") == "length"
    for step in (1, 5, len(text)):
        got_content, _, got_calls = _streamed(ChatReply(None, get_tool_parser(fmt)), text, step)
        assert ((got_content or None), got_calls) == (content, calls)


def test_qwen3_coder_values_typed_by_the_tool_schema():
    props = {"n": {"type": "integer"}, "x": {"type": "number"}, "ok": {"type": "boolean"}, "o": {"type": "object"},
             "s": {"type": "string"}, "maybe": {"type": ["integer", "null"]}, "bad": {"type": "integer"}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": props}}}]
    values = {"n": "42", "x": "2.5", "ok": "True", "o": '{"k": [1]}', "s": "007\n  indented code", "maybe": "null",
              "bad": "many", "unknown": "7"}
    # The last value leaves out its </parameter>, as models sometimes do; </function> still ends it.
    text = "<tool_call>\n<function=f>\n" + "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items())
    text = text.removesuffix("</parameter>\n") + "</function>\n</tool_call>"
    whole = ChatReply(None, get_tool_parser("qwen3_coder", tools))
    whole.feed(text, final=True)
    call = whole.message()["tool_calls"][0]["function"]
    assert json.loads(call["arguments"]) == {"n": 42, "x": 2.5, "ok": True, "o": {"k": [1]},
                                             "s": "007\n  indented code", "maybe": None, "bad": "many",
                                             "unknown": "7"}
    for step in (1, 6):
        assert _streamed(ChatReply(None, get_tool_parser("qwen3_xml", tools)), text, step)[2] == \
            [("f", call["arguments"])]


def test_required_named_and_parallel_off():
    reply = ChatReply(None, ArrayToolParser())
    reply.feed('[{"name":"a","parameters":{"x":1}},{"name":"b","parameters":{}}]', final=True)
    assert [c["function"]["name"] for c in reply.message()["tool_calls"]] == ["a", "b"]
    single = ChatReply(None, ArrayToolParser(), parallel_tool_calls=False)
    assert len(_streamed(single, '[{"name":"a","parameters":{}},{"name":"b","parameters":{}}]', 2)[2]) == 1
    content, _, calls = _streamed(ChatReply(None, NamedFunctionParser("f")), '{"q": [1, {"r": 2}]}', 3)
    assert content == "" and calls == [("f", '{"q": [1, {"r": 2}]}')]


@pytest.mark.parametrize(("name", "opened", "text", "reasoning", "content"), [
    ("deepseek_r1", False, "Let me see.</think>It is 4.", "Let me see.", "It is 4."),
    ("deepseek_r1", False, "<think>Hm.</think>Yes", "Hm.", "Yes"),
    ("deepseek_r1", False, "Cut while thinking", "Cut while thinking", ""),
    ("qwen3", False, "<think>\nHm.\n</think>\n\nYes", "\nHm.\n", "\n\nYes"),
    ("qwen3", False, "No thinking here", "", "No thinking here"),
    ("qwen3", True, "Opened by the prompt</think>Answer", "Opened by the prompt", "Answer"),
    ("qwen3", False, "<think>Cut inside", "Cut inside", ""),
    # gpt-oss (harmony): the analysis channel is the reasoning, the final channel the answer; no markup survives.
    ("openai_gptoss", False, "<|channel|>analysis<|message|>Two and 2 < 5.<|end|><|start|>assistant"
     "<|channel|>final<|message|>It is 4.<|return|>", "Two and 2 < 5.", "It is 4."),
    ("openai_gptoss", False, "<|channel|>final<|message|>Only an answer", "", "Only an answer"),
    ("openai_gptoss", False, "<|channel|>analysis<|message|>Cut while thinking", "Cut while thinking", ""),
    ("openai_gptoss", False, "No channels at all", "", "No channels at all"),
    # vLLM's other names for these formats: the reply starts inside the block (Step3, MiniMax-M2) ...
    ("step3", False, "Let me see.</think>It is 4.", "Let me see.", "It is 4."),
    ("step3", False, "Cut while thinking", "Cut while thinking", ""),
    ("minimax_m2", False, "<think>Hm.</think>Yes", "Hm.", "Yes"),
    ("minimax_m2", False, "Cut while thinking", "Cut while thinking", ""),
    ("ernie45", False, "abc\n</think>\n\n<response>\ndef\n</response>\n", "abc\n", "\ndef\n"),
    ("ernie45", False, "abc\n</think>\ndef", "abc\n", "\ndef"),
    ("ernie45", False, "abc</think>\n<response>cut", "abc", "cut"),
    # ... or the model opens it itself, or the prompt did (GLM-4.5, DeepSeek-V3.1's thinking switch).
    ("glm45", False, "<think>Hm.</think>Yes", "Hm.", "Yes"),
    ("glm45", False, "No thinking here", "", "No thinking here"),
    ("deepseek_v3", True, "Opened by the prompt</think>Answer", "Opened by the prompt", "Answer"),
    ("deepseek_v3", False, "No thinking here", "", "No thinking here"),
])
def test_reasoning_split(name, opened, text, reasoning, content):
    for step in (1, 4, len(text)):
        got_content, got_reasoning, _ = _streamed(ChatReply(get_reasoning_parser(name, opened)), text, step)
        assert (got_reasoning, got_content) == (reasoning, content)
    whole = ChatReply(get_reasoning_parser(name, opened))
    whole.feed(text, final=True)
    msg = whole.message()
    assert (msg["reasoning_content"] or "", msg["content"] or "") == (reasoning, content)


def test_reasoning_goes_out_under_both_names():
    """vLLM >= 0.10 sends `reasoning` (message and deltas); older clients read `reasoning_content`: both go out."""
    from types import SimpleNamespace

    from wslm.backend.entrypoints.openai.serving_chat import _message

    reply = ChatReply(get_reasoning_parser("qwen3"))
    deltas = reply.feed("<think>Hm.</think>Yes", final=True)
    assert [d["reasoning"] for d in deltas if "reasoning" in d] == [d["reasoning_content"] for d in deltas
                                                                     if "reasoning_content" in d] == ["Hm."]
    msg = _message(SimpleNamespace(grammar=None), reply, "stop")
    assert (msg["reasoning"], msg["reasoning_content"], msg["content"]) == ("Hm.", "Hm.", "Yes")


def test_parsers_picked_from_templates():
    assert pick_tool_parser("{% if tools %}<tool_call>{% endif %}") == "hermes"
    assert pick_tool_parser("<tool_call>\n<function=example_function_name>") == "qwen3_coder"
    assert pick_tool_parser("[TOOL_CALLS] {{ tools }}") == "mistral"
    assert pick_tool_parser("<|start_header_id|>{% if tools %}{% endif %}") == "llama3_json"
    assert pick_tool_parser("[func_name1(params_name1=params_value1)]") == "pythonic"
    assert pick_tool_parser("<|im_start|>{{ message.content }}") is None
    assert pick_reasoning_parser("{% if enable_thinking %}<think>{% endif %}") == "qwen3"
    assert pick_reasoning_parser("<｜Assistant｜><think>\n") == "deepseek_r1"
    assert pick_reasoning_parser("<|im_start|>") is None
    assert pick_reasoning_parser("<|start|>assistant<|channel|>final<|message|>") == "openai_gptoss"
    assert prompt_opens_think("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_think("<think>\n\n</think>\n\n")


def test_plan_tool_choice_none_and_exclude_flag():
    from types import SimpleNamespace

    from wslm.backend.entrypoints.openai.protocol import ChatCompletionRequest
    from wslm.backend.entrypoints.openai.serving_tools import plan_chat

    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    req = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "tools": [tool],
                                                "tool_choice": "none"})
    req.sampling_params(5, None)
    state = SimpleNamespace(enable_auto_tool_choice=False, tool_call_parser=None, reasoning_parser=None,
                            exclude_tools_when_tool_choice_none=False)
    plan = plan_chat(state, req)
    assert plan.template_tools == [tool] and plan.tool_parser is None and plan.grammar is None
    state.exclude_tools_when_tool_choice_none = True
    assert plan_chat(state, req).template_tools is None
    # "auto" hands the request's tools to the parser: qwen3_coder types the raw "3" by the schema.
    typed = {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                          "properties": {"n": {"type": "integer"}}}}}
    req = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "tools": [typed]})
    req.sampling_params(5, None)
    plan = plan_chat(SimpleNamespace(enable_auto_tool_choice=True, tool_call_parser="qwen3_xml", reasoning_parser=None),
                     req)
    reply = plan.new_reply()
    reply.feed("<tool_call>\n<function=f>\n<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>", final=True)
    assert reply.message()["tool_calls"][0]["function"]["arguments"] == '{"n": 3}'


def test_serve_accepts_vllm_parser_names():
    import argparse

    from wslm.backend.entrypoints.cli import serve as serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.register(parser.add_subparsers())
    for name in ("hermes", "llama3_json", "llama4_json", "mistral", "openai", "pythonic", "llama4_pythonic", "qwen3_coder",
                 "qwen3_xml"):
        assert parser.parse_args(["serve", "--tool-call-parser", name]).tool_call_parser == name
    for name in ("deepseek_r1", "qwen3", "openai_gptoss", "step3", "minimax_m2", "ernie45", "glm45", "deepseek_v3"):
        assert parser.parse_args(["serve", "--reasoning-parser", name]).reasoning_parser == name


@pytest.mark.parametrize("name", ["granite", "mistral", "seed_oss", "hunyuan_a13b", "no_such_parser"])
def test_unsupported_reasoning_parser_is_a_clear_error(name, capsys):
    import argparse

    from wslm.backend.entrypoints.cli import serve as serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.register(parser.add_subparsers())
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--reasoning-parser", name])
    err = capsys.readouterr().err
    assert name in err and "Supported: deepseek_r1, qwen3, openai_gptoss" in err and "invalid choice" not in err


def test_named_chat_templates_pick_tool_use_with_tools():
    """A tokenizer with several named templates (Hermes 3's "default" and "tool_use") renders with "tool_use"
    when tools are sent and "default" otherwise; the tool format is read from all of them."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from wslm.backend.frontend.chat import render_chat_text, template_text

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")))
    tok.chat_template = {"default": "PLAIN {{ messages[0].content }}",
                         "tool_use": "TOOLS {{ tools | length }}: <tool_call>{{ messages[0].content }}"}
    ask = [{"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert render_chat_text(tok, ask, None, "m") == "PLAIN hi"
    assert render_chat_text(tok, ask, None, "m", tools=tools) == "TOOLS 1: <tool_call>hi"
    assert pick_tool_parser(template_text(tok.chat_template)) == "hermes"


def test_special_marker_tokens_are_kept_in_the_text():
    """A tokenizer that marks <tool_call> special (some Hermes checkpoints) would drop it when detokenizing:
    a request the hermes parser reads then keeps special tokens (vLLM's parsers ask the same); Qwen's, where
    <tool_call> is an ordinary added token, do not need it."""
    from types import SimpleNamespace

    from tokenizers import AddedToken, Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from wslm.backend.entrypoints.openai.protocol import ChatCompletionRequest
    from wslm.backend.entrypoints.openai.serving_tools import plan_chat

    req = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS})
    req.sampling_params(5, None)
    for special in (True, False):
        tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")))
        tok.add_tokens([AddedToken("<tool_call>", special=special), AddedToken("</tool_call>", special=special)])
        state = SimpleNamespace(enable_auto_tool_choice=True, tool_call_parser="hermes", reasoning_parser=None,
                                tokenizer=tok)
        assert plan_chat(state, req).keep_special_tokens is special
        state.tool_call_parser = "pythonic"
        assert plan_chat(state, req).keep_special_tokens is False


def test_harmony_markers_that_are_special_tokens_are_kept_in_the_text(demo_tok):
    import copy
    from types import SimpleNamespace

    from wslm.backend.entrypoints.openai.protocol import ChatCompletionRequest
    from wslm.backend.entrypoints.openai.serving_tools import plan_chat

    tok = copy.deepcopy(demo_tok)  # the session's tokenizer stays as it is
    tok.add_special_tokens({"additional_special_tokens": ["<|channel|>", "<|message|>", "<|end|>"]})
    req = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}]})
    req.sampling_params(5, None)
    state = SimpleNamespace(enable_auto_tool_choice=False, tool_call_parser=None, reasoning_parser="openai_gptoss",
                            tokenizer=tok)  # fmt: skip
    assert plan_chat(state, req).keep_special_tokens  # else skip_special_tokens would erase the channels
    state.reasoning_parser = "qwen3"
    assert not plan_chat(state, req).keep_special_tokens


def test_constraint_waits_for_think_blocks_only():
    """A constraint is moved behind `</think>` for the think-block parsers; harmony's channels (gpt-oss) are
    special tokens a grammar cannot write, so there it applies from the first token."""
    from wslm.backend.entrypoints.openai.serving_tools import ChatPlan
    from wslm.backend.structured.params import StructuredOutputsParams

    spec = StructuredOutputsParams(regex="[0-9]+")
    for name, wrapped in (("qwen3", True), ("deepseek_r1", True), ("openai_gptoss", False), (None, False)):
        plan = ChatPlan(None, None, None, True, name)
        assert (plan.after_reasoning(spec) is not spec) is wrapped, name
    closed = ChatPlan(None, None, None, True, "qwen3", think_closed=True)
    assert closed.after_reasoning(spec) is spec
