"""gpt-oss's harmony format on its own: the openai_gptoss reasoning parser with the openai tool-call parser turn
scripted harmony replies into reasoning, content and OpenAI tool_calls, the same for every split of the reply
into streamed pieces as for the whole reply; and chat history with tool calls renders through a harmony
template (the part of gpt-oss's chat template that renders assistant calls, tool results and reasoning)."""

from __future__ import annotations

import json

import pytest

from wslm.backend.entrypoints.openai.chat_reply import ChatReply
from wslm.backend.entrypoints.openai.reasoning import get_reasoning_parser, pick_reasoning_parser
from wslm.backend.entrypoints.openai.tool_parsers import get_tool_parser, pick_tool_parser

ANALYSIS = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
CALL = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Pa\\"ris", "days": [1]}'
WEATHER = ("get_weather", {"city": 'Pa"ris', "days": [1]})


@pytest.mark.parametrize(("text", "reasoning", "content", "calls"), [
    # The reply stops at <|call|> (a stop token, so not in the text); with it, the same.
    (ANALYSIS + CALL, "Need the weather.", None, [WEATHER]),
    (ANALYSIS + CALL + "<|call|>", "Need the weather.", None, [WEATHER]),
    # The recipient before the channel (as the template writes past calls); a preamble for the user first.
    ("<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant to=functions.get_time<|channel|>"
     "commentary json<|message|>{}", None, "Checking.", [("get_time", {})]),
    (" to=functions.get_time<|channel|>commentary json<|message|>{}", None, None, [("get_time", {})]),
    # A call on the analysis channel is a call too.
    ("<|channel|>analysis to=functions.get_time <|constrain|>json<|message|>{}", None, None, [("get_time", {})]),
    # No call: analysis → reasoning_content, final → content, and no markup anywhere.
    (ANALYSIS + "<|channel|>final<|message|>It is 4 < 5.<|return|>", "Need the weather.", "It is 4 < 5.", []),
    # A built-in tool's call (browser) is nothing wslm runs.
    ("<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>analysis to=browser.search "
     '<|constrain|>json<|message|>{"query": "x"}', "Hm.", None, []),
    # Plain text (a grammar forced the reply): content.
    ("Just text", None, "Just text", []),
])
def test_every_split_streams_the_same_calls_as_the_whole_reply(text, reasoning, content, calls):
    def reply() -> ChatReply:
        return ChatReply(get_reasoning_parser("openai_gptoss"), get_tool_parser("openai"))

    whole = reply()
    whole.feed(text, final=True)
    msg = whole.message()
    got_calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls", [])]
    assert (msg["reasoning_content"], msg["content"], got_calls) == (reasoning, content, calls)
    assert all(c["id"].startswith("call_") for c in msg.get("tool_calls", []))
    assert whole.finish_reason("stop") == ("tool_calls" if calls else "stop")
    whole_calls = [(c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls", [])]
    # Every cut into two pieces, and token-sized pieces: the deltas fold into exactly the whole reply.
    splits = [[text[:k], text[k:]] for k in range(len(text) + 1)] + [[text[i:i + 3] for i in range(0, len(text), 3)]]
    for pieces in splits:
        streamed = reply()
        deltas = [d for p in pieces for d in streamed.feed(p, final=False)] + streamed.feed("", final=True)
        folded: dict[int, list[str]] = {}
        for d in deltas:
            for tc in d.get("tool_calls", []):
                if "id" in tc:  # OpenAI's shape: index, id, type and name first, with empty arguments
                    assert tc["index"] not in folded and tc["type"] == "function" and tc["function"]["arguments"] == ""
                    folded[tc["index"]] = [tc["function"]["name"], ""]
                else:
                    assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
                folded[tc["index"]][1] += tc["function"]["arguments"]
        got = ("".join(d.get("reasoning_content", "") for d in deltas) or None,
               "".join(d.get("content", "") for d in deltas) or None, [tuple(v) for v in folded.values()])
        assert got == (reasoning, content, whole_calls), pieces


def test_harmony_template_picks_both_parsers():
    template = '{{- "<|start|>assistant to=" }}{{- "functions." + tool_call.name + "<|channel|>commentary " }}'
    assert pick_tool_parser(template) == "openai"
    assert pick_reasoning_parser(template) == "openai_gptoss"


# gpt-oss's chat template, the part that renders messages (its system and developer messages left out): one
# call per assistant message, each tool result named after the latest call, reasoning from `thinking`.
HARMONY_TEMPLATE = """
{%- set last_tool_call = namespace(name=none) -%}
{%- for message in messages -%}
{%- if message.role == 'assistant' -%}
{%- if "tool_calls" in message -%}
{%- set future_final_message = namespace(found=false) -%}
{%- for future_message in messages[loop.index:] -%}
{%- if future_message.role == 'assistant' and "tool_calls" not in future_message -%}
{%- set future_final_message.found = true -%}{%- endif -%}
{%- endfor -%}
{%- set tool_call = message.tool_calls[0] -%}
{%- if tool_call.function -%}{%- set tool_call = tool_call.function -%}{%- endif -%}
{%- if message.content and message.thinking -%}
{{- raise_exception("Cannot pass both content and thinking in an assistant message with tool calls!") -}}
{%- elif message.content and not future_final_message.found -%}
{{- "<|start|>assistant<|channel|>analysis<|message|>" + message.content + "<|end|>" -}}
{%- elif message.thinking and not future_final_message.found -%}
{{- "<|start|>assistant<|channel|>analysis<|message|>" + message.thinking + "<|end|>" -}}
{%- endif -%}
{{- "<|start|>assistant to=functions." + tool_call.name + "<|channel|>commentary json<|message|>" -}}
{{- tool_call.arguments|tojson + "<|call|>" -}}
{%- set last_tool_call.name = tool_call.name -%}
{%- else -%}
{{- "<|start|>assistant<|channel|>final<|message|>" + message.content + "<|end|>" -}}
{%- set last_tool_call.name = none -%}
{%- endif -%}
{%- elif message.role == 'tool' -%}
{%- if last_tool_call.name is none -%}{{- raise_exception("Message has tool role, but no previous call!") -}}{%- endif -%}
{{- "<|start|>functions." + last_tool_call.name + " to=assistant<|channel|>commentary<|message|>" -}}
{{- message.content|tojson + "<|end|>" -}}
{%- else -%}
{{- "<|start|>" + message.role + "<|message|>" + message.content + "<|end|>" -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}"""

# An OpenAI client's tool loop: two parallel calls in one message, reasoning sent back, results out of order.
HISTORY = [
    {"role": "user", "content": "Weather in Paris and the time?"},
    {"role": "assistant", "content": None, "reasoning_content": "Look both up.", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_b", "content": "12:00"},
    {"role": "tool", "tool_call_id": "call_a", "content": "Sunny"},
]
RENDERED = (
    "<|start|>user<|message|>Weather in Paris and the time?<|end|>"
    "<|start|>assistant<|channel|>analysis<|message|>Look both up.<|end|>"
    '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>'
    '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"Sunny"<|end|>'
    "<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{}<|call|>"
    '<|start|>functions.get_time to=assistant<|channel|>commentary<|message|>"12:00"<|end|>'
    "<|start|>assistant")


def _word_tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")))


def test_history_with_tool_calls_renders_through_the_harmony_template():
    from wslm.backend.frontend.chat import render_chat_text

    tok = _word_tokenizer()
    assert render_chat_text(tok, HISTORY, HARMONY_TEMPLATE, "m") == RENDERED
    # Reasoning and a preamble beside one call both reach the analysis text (the template takes one of them);
    # an empty tool_calls list is no call; a final answer later drops the old reasoning, as the template does.
    both = [HISTORY[0], {**HISTORY[1], "content": "Let me check.", "tool_calls": HISTORY[1]["tool_calls"][:1]},
            HISTORY[3], {"role": "assistant", "content": "Sunny.", "tool_calls": []}, HISTORY[0]]
    text = render_chat_text(tok, both, HARMONY_TEMPLATE, "m")
    assert "<|channel|>analysis" not in text and "<|channel|>final<|message|>Sunny.<|end|>" in text
    text = render_chat_text(tok, both[:3], HARMONY_TEMPLATE, "m")
    assert "<|channel|>analysis<|message|>Look both up.\n\nLet me check.<|end|>" in text
