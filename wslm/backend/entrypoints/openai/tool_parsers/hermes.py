"""Hermes / Qwen 2.5 / Qwen 3 format: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one block
per call, after any plain text."""

from __future__ import annotations

from wslm.backend.entrypoints.openai.tool_parsers.base import (
    Parse,
    ParsedCall,
    ToolParser,
    call_from_object,
    parse_tagged_calls,
)
from wslm.backend.entrypoints.openai.tool_parsers.json_scan import NotJSON

START = "<tool_call>"


class HermesToolParser(ToolParser):
    name = "hermes"
    markers = (START,)
    output_markers = (START, "</tool_call>")

    def parse(self, text: str, final: bool) -> Parse:
        return parse_tagged_calls(text, final, START, _read_call)


def _read_call(text: str, body: int) -> tuple[ParsedCall, int | None]:
    if text[body] != "{":
        raise NotJSON("a Hermes tool call is a JSON object")
    call, scan = call_from_object(text, body)
    return call, scan.end
