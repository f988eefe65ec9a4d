"""What every tool-call parser shares: the parse result, the call built from a JSON object, and ToolCallStream,
which turns successive parses of the growing reply into OpenAI's streamed tool_calls deltas. A non-streamed
reply runs through the same ToolCallStream in one go, so both shapes carry the same calls."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from wslm.backend.entrypoints.openai.tool_parsers.json_scan import (
    NotJSON,
    ObjectScan,
    partial_suffix,
    scan_object,
    skip_ws,
)


def make_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ParsedCall:
    name: str | None  # None until the whole name has arrived
    arguments: str  # the arguments' JSON text so far (whole once the call is)


@dataclass
class Parse:
    content_end: int  # text[:content_end] is plain content, safe to send
    calls: list[ParsedCall] = field(default_factory=list)
    invalid: bool = False  # what looked like a tool call is not one: the whole text is content


class ToolParser:
    """One model family's tool-call format. parse() sees the whole reply so far; final: no more text comes
    (an unfinished marker or call is then content, or a call cut short)."""

    name = ""
    # Text that, when the chat template contains it, picks this parser (see registry.pick_tool_parser).
    markers: tuple[str, ...] = ()
    # Marker tokens the parser must see in the reply. Some tokenizers mark them special (then skipped when
    # the reply is detokenized): such a request keeps special tokens in its text, as vLLM's parsers ask.
    output_markers: tuple[str, ...] = ()

    def __init__(self, tools: list[dict] | None = None) -> None:
        """tools: the request's tools (a format whose values are untyped text reads their schemas)."""

    def parse(self, text: str, final: bool) -> Parse:
        raise NotImplementedError


def call_from_object(text: str, start: int, argument_keys: tuple[str, ...] = ("arguments", "parameters")
                     ) -> tuple[ParsedCall, ObjectScan]:
    """A call from the JSON object at text[start] ({"name": ..., "arguments": {...}}), possibly unfinished."""
    scan = scan_object(text, start)
    name = None
    if "name" in scan.fields:
        s, e = scan.fields["name"]
        if e is not None:
            value = json.loads(text[s:e])
            if not isinstance(value, str):
                raise NotJSON("a tool call's name must be a string")
            name = value
    args = ""
    for key in argument_keys:
        if key in scan.fields:
            s, e = scan.fields[key]
            if e is not None:
                args = text[s:e]
            elif text[s] in "{[":
                args = text[s:]  # everything after an open brace belongs to the arguments
            break
    else:
        if scan.end is not None:
            args = "{}"
    if scan.end is not None and name is None:
        raise NotJSON("a tool call needs a name")
    return ParsedCall(name, args), scan


def is_special_token(tokenizer: Any, text: str) -> bool:
    """Whether text is one special token of this tokenizer (dropped by skip_special_tokens)."""
    if text in (getattr(tokenizer, "all_special_tokens", None) or ()):
        return True
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return any(t.content == text and t.special for t in added.values())


def parse_tagged_calls(text: str, final: bool, start_tag: str,
                       read_call: Callable[[str, int], tuple[ParsedCall | None, int | None]]) -> Parse:
    """Plain content, then calls each opened by start_tag (Hermes, Qwen3-Coder). read_call(text, i) reads the
    call whose body starts at text[i]: (the call, or None while its name is still arriving; the index after
    it, or None while unfinished); it raises NotJSON when what follows the tag is not a call."""
    first = text.find(start_tag)
    if first < 0:
        return Parse(len(text) if final else len(text) - partial_suffix(text, start_tag))
    result = Parse(first)
    pos = first
    while (pos := text.find(start_tag, pos)) >= 0:
        body = skip_ws(text, pos + len(start_tag))
        if body >= len(text):
            break
        call, end = read_call(text, body)
        if call is not None:
            result.calls.append(call)
        if end is None:
            break
        pos = end
    return result


class ToolCallStream:
    """Follows one choice's reply: update() with the whole text so far returns the new content and the
    tool_calls deltas in OpenAI's shape (index, id, type and name first with empty arguments; then argument
    pieces)."""

    def __init__(self, parser: ToolParser, parallel_tool_calls: bool = True) -> None:
        self.parser = parser
        self.parallel = parallel_tool_calls
        self.content_sent = 0
        self.ids: list[str] = []
        self.names: list[str] = []
        self.args_sent: list[int] = []
        self.arguments: list[str] = []

    @property
    def called(self) -> bool:
        return bool(self.ids)

    def update(self, text: str, final: bool) -> tuple[str, list[dict]]:
        try:
            parse = self.parser.parse(text, final)
        except NotJSON:
            parse = Parse(len(text), invalid=True)
        calls = [c for c in parse.calls if c.name is not None]
        # Not a call after all, or the reply ended before any call's name was whole: all of it is content.
        if parse.invalid or (final and not calls and not self.ids):
            parse, calls = Parse(len(text) if not self.ids else self.content_sent), []
        content = ""
        if parse.content_end > self.content_sent and not self.ids:
            content = text[self.content_sent:parse.content_end]
            self.content_sent = parse.content_end
        deltas: list[dict] = []
        # A call cut short (max_tokens) stays, with the arguments written so far, as OpenAI returns it (its
        # finish_reason says "length"); a stream has sent those pieces already, so both shapes agree.
        if not self.parallel:
            calls = calls[:1]
        for i, call in enumerate(calls):
            if i >= len(self.ids):
                self.ids.append(make_tool_call_id())
                self.names.append(call.name)
                self.args_sent.append(0)
                self.arguments.append("")
                deltas.append({"index": i, "id": self.ids[i], "type": "function",
                               "function": {"name": call.name, "arguments": ""}})
            if len(call.arguments) > self.args_sent[i] and call.arguments.startswith(self.arguments[i]):
                piece = call.arguments[self.args_sent[i]:]
                self.args_sent[i] = len(call.arguments)
                self.arguments[i] = call.arguments
                deltas.append({"index": i, "function": {"arguments": piece}})
        return content, deltas

    def tool_calls(self) -> list[dict]:
        """The calls so far, whole, as a non-streamed message carries them."""
        return [{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                for i, n, a in zip(self.ids, self.names, self.arguments, strict=True)]
