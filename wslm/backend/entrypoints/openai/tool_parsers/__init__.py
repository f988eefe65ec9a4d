"""Tool-call parsers (vLLM's names: hermes, llama3_json, mistral, openai, pythonic, qwen3_coder, and vLLM's aliases
for the same formats), one file each, and the registry that picks one by name or from the chat template."""

from __future__ import annotations

from wslm.backend.entrypoints.openai.tool_parsers.base import (
    ParsedCall,
    ToolCallStream,
    ToolParser,
    is_special_token,
    make_tool_call_id,
)
from wslm.backend.entrypoints.openai.tool_parsers.hermes import HermesToolParser
from wslm.backend.entrypoints.openai.tool_parsers.llama3_json import Llama3JsonToolParser
from wslm.backend.entrypoints.openai.tool_parsers.mistral import (
    ArrayToolParser,
    MistralToolParser,
    NamedFunctionParser,
)
from wslm.backend.entrypoints.openai.tool_parsers.openai import OpenAIToolParser
from wslm.backend.entrypoints.openai.tool_parsers.pythonic import PythonicToolParser
from wslm.backend.entrypoints.openai.tool_parsers.qwen3_coder import Qwen3CoderToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
    "openai": OpenAIToolParser,  # gpt-oss's harmony calls
    "pythonic": PythonicToolParser,
    "qwen3_coder": Qwen3CoderToolParser,
    # vLLM's other names for these formats, so that launch scripts run unchanged.
    "llama4_json": Llama3JsonToolParser,
    "llama4_pythonic": PythonicToolParser,
    "qwen3_xml": Qwen3CoderToolParser,
}


def get_tool_parser(name: str, tools: list[dict] | None = None) -> ToolParser:
    try:
        return TOOL_PARSERS[name](tools)
    except KeyError:
        raise ValueError(f"Unknown tool-call parser {name!r}; choose one of {', '.join(TOOL_PARSERS)}.") from None


def pick_tool_parser(chat_template: str | None) -> str | None:
    """The parser a chat template's own tool format calls for, or None when it shows no tool format."""
    t = chat_template or ""
    if "<|channel|>" in t and "functions." in t:
        return "openai"  # harmony (gpt-oss)
    if "<tool_call>" in t and "<function=" in t:
        return "qwen3_coder"
    if "<tool_call>" in t:
        return "hermes"
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "[func_name1(" in t or "func_name1(params_name1=" in t:
        return "pythonic"
    if "<|start_header_id|>" in t and "tools" in t:
        return "llama3_json"
    return None


__all__ = ["TOOL_PARSERS", "Qwen3CoderToolParser", "ArrayToolParser", "NamedFunctionParser", "ParsedCall", "ToolCallStream", "ToolParser",
           "get_tool_parser", "is_special_token", "make_tool_call_id", "pick_tool_parser"]
