"""Mistral format: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` after any plain text. ArrayToolParser
also reads the bare array that tool_choice="required" makes the model write (vLLM's shape, with
"parameters")."""

from __future__ import annotations

from wslm.backend.entrypoints.openai.tool_parsers.base import Parse, ParsedCall, ToolParser, call_from_object
from wslm.backend.entrypoints.openai.tool_parsers.json_scan import NotJSON, partial_suffix, skip_ws, value_end

START = "[TOOL_CALLS]"


def parse_call_array(text: str, i: int, result: Parse) -> Parse:
    """The calls of the JSON array at text[i] ('[' expected), appended to result."""
    if i >= len(text):
        return result
    if text[i] != "[":
        raise NotJSON("expected a JSON array of calls")
    i = skip_ws(text, i + 1)
    while i < len(text) and text[i] != "]":
        if text[i] != "{":
            raise NotJSON("expected a call object")
        call, scan = call_from_object(text, i)
        result.calls.append(call)
        if scan.end is None:
            break
        i = skip_ws(text, scan.end)
        if i < len(text) and text[i] == ",":
            i = skip_ws(text, i + 1)
    return result


class MistralToolParser(ToolParser):
    name = "mistral"
    markers = (START,)
    output_markers = (START,)

    def parse(self, text: str, final: bool) -> Parse:
        first = text.find(START)
        if first < 0:
            # [TOOL_CALLS] is a special token in Mistral's HF tokenizers, dropped from the text when special
            # tokens are skipped: a reply that starts with the bare array is read as calls too.
            i = skip_ws(text, 0)
            if text.startswith("[{", i) or (not final and text[i:] == "["):
                return parse_call_array(text, i, Parse(0))
            return Parse(len(text) if final else len(text) - partial_suffix(text, START))
        return parse_call_array(text, skip_ws(text, first + len(START)), Parse(first))


class ArrayToolParser(ToolParser):
    """tool_choice="required": the reply is `[{"name": ..., "parameters": {...}}, ...]` (forced by a grammar)."""

    name = "required"

    def parse(self, text: str, final: bool) -> Parse:
        return parse_call_array(text, skip_ws(text, 0), Parse(0))


class NamedFunctionParser(ToolParser):
    """tool_choice={"type": "function", ...}: the reply is the named function's arguments object."""

    name = "named"

    def __init__(self, function_name: str) -> None:
        self.function_name = function_name

    def parse(self, text: str, final: bool) -> Parse:
        start = skip_ws(text, 0)
        end = value_end(text, start) if start < len(text) else None
        args = text[start:end] if end is not None else text[start:].rstrip()
        return Parse(0, [ParsedCall(self.function_name, args)])
