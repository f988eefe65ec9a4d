"""Llama 3.1 / 3.2 JSON format: the reply is `{"name": ..., "parameters": {...}}` (optionally after
`<|python_tag|>`), several calls separated by `;`. A reply that does not start that way is plain content."""

from __future__ import annotations

from wslm.backend.entrypoints.openai.tool_parsers.base import Parse, ToolParser, call_from_object
from wslm.backend.entrypoints.openai.tool_parsers.json_scan import skip_ws

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"
    markers = (PYTHON_TAG,)

    def parse(self, text: str, final: bool) -> Parse:
        i = skip_ws(text, 0)
        rest = text[i:]
        if rest.startswith(PYTHON_TAG):
            i = skip_ws(text, i + len(PYTHON_TAG))
        elif PYTHON_TAG.startswith(rest) and rest and not final:
            return Parse(0)  # maybe the tag, still arriving
        if i >= len(text):
            return Parse(len(text) if final else 0)
        if text[i] != "{":
            return Parse(len(text), invalid=True)
        result = Parse(0)
        while i < len(text):
            call, scan = call_from_object(text, i)
            result.calls.append(call)
            if scan.end is None:
                break
            i = skip_ws(text, scan.end)
            if i < len(text) and text[i] == ";":
                i = skip_ws(text, i + 1)
            elif i < len(text):
                break  # trailing text after the calls is dropped, as vLLM does
        return result
