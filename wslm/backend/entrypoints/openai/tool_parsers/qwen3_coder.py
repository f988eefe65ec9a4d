"""Qwen3-Coder format (vLLM's qwen3_coder, also called qwen3_xml): XML-like calls after any plain text, whose
parameter values are raw text (code needs no JSON escaping), typed by the tool's JSON schema:

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

A parameter is streamed once its value is whole; the arguments object closes with `</function>`."""

from __future__ import annotations

import ast
import json
from typing import Any

from wslm.backend.entrypoints.openai.tool_parsers.base import (
    Parse,
    ParsedCall,
    ToolParser,
    parse_tagged_calls,
)
from wslm.backend.entrypoints.openai.tool_parsers.json_scan import NotJSON

START = "<tool_call>"
FUNCTION = "<function="
FUNCTION_END = "</function>"
PARAMETER = "<parameter="
PARAMETER_END = "</parameter>"


class Qwen3CoderToolParser(ToolParser):
    name = "qwen3_coder"
    markers = (FUNCTION,)
    output_markers = (START, "</tool_call>")

    def __init__(self, tools: list[dict] | None = None) -> None:
        super().__init__(tools)
        # Each function's parameter schemas, to type the raw text values (as vLLM's parser does).
        self.schemas: dict[str, dict] = {}
        for t in tools or []:
            fn = t.get("function", t)
            props = (fn.get("parameters") or {}).get("properties")
            if isinstance(fn.get("name"), str) and isinstance(props, dict):
                self.schemas[fn["name"]] = props

    def parse(self, text: str, final: bool) -> Parse:
        return parse_tagged_calls(text, final, START, lambda t, body: self._read_call(t, body, final))

    def _read_call(self, text: str, body: int, final: bool) -> tuple[ParsedCall | None, int | None]:
        rest = text[body:]
        if not rest.startswith(FUNCTION):
            if FUNCTION.startswith(rest) and not final:
                return None, None  # `<function=` still arriving
            raise NotJSON("a Qwen3-Coder tool call starts with <function=NAME>")
        name_end = text.find(">", body)
        if name_end < 0:
            return None, None
        name = text[body + len(FUNCTION):name_end].strip()
        end = text.find(FUNCTION_END, name_end)
        params = self._parameters(name, text[name_end + 1:end if end >= 0 else len(text)], end >= 0)
        args = "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}"
                               for k, v in params) + ("}" if end >= 0 else "")
        return ParsedCall(name, args), (end if end >= 0 else None)

    def _parameters(self, function: str, section: str, closed: bool) -> list[tuple[str, Any]]:
        """The whole parameters of one function body (all of them once the function closed)."""
        out: list[tuple[str, Any]] = []
        pos = 0
        while (start := section.find(PARAMETER, pos)) >= 0:
            name_end = section.find(">", start)
            if name_end < 0:
                break
            name = section[start + len(PARAMETER):name_end].strip()
            # A value ends at `</parameter>`; models sometimes leave it out before the next parameter.
            ends = [i for i in (section.find(PARAMETER_END, name_end), section.find(PARAMETER, name_end))
                    if i >= 0]
            end = min(ends) if ends else (len(section) if closed else -1)
            if end < 0:
                break
            value = section[name_end + 1:end]
            value = value[1:] if value.startswith("\n") else value
            value = value[:-1] if value.endswith("\n") else value
            out.append((name, self._typed(function, name, value)))
            pos = end
        return out

    def _typed(self, function: str, name: str, value: str) -> Any:
        """The raw value as its schema's type says (vLLM's conversions); text when it does not parse."""
        if value.strip().lower() == "null":
            return None
        schema = self.schemas.get(function, {}).get(name)
        if not isinstance(schema, dict):
            return value
        kind = schema.get("type", "string")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "string")
        kind = str(kind).lower()
        try:
            if kind in ("string", "str", "text"):
                return value
            if kind in ("integer", "int"):
                return int(value.strip())
            if kind in ("number", "float"):
                number = float(value.strip())
                return int(number) if number.is_integer() and "." not in value else number
            if kind in ("boolean", "bool"):
                return value.strip().lower() == "true"
            if kind in ("object", "array"):
                return json.loads(value)
            return ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            return value
