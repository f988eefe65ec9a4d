"""Pythonic format (Llama 3.2 / Llama 4, ToolACE): the reply is a Python list of calls,
`[get_weather(city="Paris", unit="celsius"), other(x=1)]`. Each call is streamed once it is whole (its
arguments are Python literals, read with ast, sent as JSON)."""

from __future__ import annotations

import ast
import json

from wslm.backend.entrypoints.openai.tool_parsers.base import Parse, ParsedCall, ToolParser
from wslm.backend.entrypoints.openai.tool_parsers.json_scan import NotJSON, skip_ws


def _element_ends(text: str, i: int) -> tuple[list[tuple[int, int]], bool]:
    """Spans of the whole top-level elements of the list starting at text[i] == '[', and whether it closed."""
    spans = []
    depth = 0
    start = i + 1
    quote = None
    j = i
    while j < len(text):
        c = text[j]
        if quote:
            if c == "\\":
                j += 2
                continue
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                if text[start:j].strip():
                    spans.append((start, j))
                return spans, True
        elif c == "," and depth == 1:
            spans.append((start, j))
            start = j + 1
        j += 1
    return spans, False


def _call(source: str) -> ParsedCall:
    try:
        node = ast.parse(source.strip(), mode="eval").body
    except SyntaxError as exc:
        raise NotJSON(f"not a Python call: {exc}") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, (ast.Name, ast.Attribute)) or node.args:
        raise NotJSON("expected name(keyword=value, ...)")
    try:
        args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
    except ValueError as exc:
        raise NotJSON(f"arguments must be literals: {exc}") from None
    return ParsedCall(ast.unparse(node.func), json.dumps(args, ensure_ascii=False))


class PythonicToolParser(ToolParser):
    name = "pythonic"
    markers = ("[func_name1(", "func_name1(params_name1=")

    def parse(self, text: str, final: bool) -> Parse:
        i = skip_ws(text, 0)
        if i >= len(text):
            return Parse(len(text) if final else 0)
        if text[i] != "[":
            return Parse(len(text), invalid=True)
        spans, closed = _element_ends(text, i)
        calls = [_call(text[s:e]) for s, e in spans]
        if final and not closed:
            raise NotJSON("the list of calls never closed")
        return Parse(0, calls)
