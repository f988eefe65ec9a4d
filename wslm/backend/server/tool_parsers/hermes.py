"""Hermes / Qwen 2.5 / Qwen 3 format: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one block
per call, after any plain text."""

from __future__ import annotations

from wslm.backend.server.tool_parsers.base import Parse, ToolParser, call_from_object
from wslm.backend.server.tool_parsers.json_scan import partial_suffix, skip_ws

START = "<tool_call>"


class HermesToolParser(ToolParser):
    name = "hermes"
    markers = (START,)

    def parse(self, text: str, final: bool) -> Parse:
        first = text.find(START)
        if first < 0:
            return Parse(len(text) if final else len(text) - partial_suffix(text, START))
        result = Parse(first)
        pos = first
        while (pos := text.find(START, pos)) >= 0:
            body = skip_ws(text, pos + len(START))
            if body >= len(text):
                break
            if text[body] != "{":
                return Parse(len(text), invalid=True)
            call, scan = call_from_object(text, body)
            result.calls.append(call)
            if scan.end is None:
                break
            pos = scan.end
        return result
