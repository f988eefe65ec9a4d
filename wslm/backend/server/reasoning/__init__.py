"""Reasoning parsers (vLLM's names: deepseek_r1, qwen3), one file each, and the registry that picks one by name
or from the chat template."""

from __future__ import annotations

from wslm.backend.server.reasoning.base import THINK_END, THINK_START, ReasoningParser, ReasoningStream
from wslm.backend.server.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from wslm.backend.server.reasoning.gpt_oss import GptOssReasoningParser
from wslm.backend.server.reasoning.qwen3 import Qwen3ReasoningParser

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "qwen3": Qwen3ReasoningParser,
    "openai_gptoss": GptOssReasoningParser,
}


def get_reasoning_parser(name: str, opened: bool = False) -> ReasoningParser:
    try:
        return REASONING_PARSERS[name](opened)
    except KeyError:
        raise ValueError(f"Unknown reasoning parser {name!r}; choose one of {', '.join(REASONING_PARSERS)}.") from None


def pick_reasoning_parser(chat_template: str | None) -> str | None:
    """qwen3 for templates that speak of `<think>` and let the model open it (Qwen3's enable_thinking),
    deepseek_r1 for other `<think>` templates, openai_gptoss for harmony's channels; None otherwise."""
    t = chat_template or ""
    if "<|channel|>" in t:
        return "openai_gptoss"  # harmony (gpt-oss)
    if THINK_START not in t and THINK_END not in t:
        return None
    return "qwen3" if ("enable_thinking" in t or "<tool_call>" in t) else "deepseek_r1"


def prompt_opens_think(prompt_tail: str) -> bool:
    """Whether the rendered prompt ends inside an open think block (its last `<think>` is not closed)."""
    return prompt_tail.rfind(THINK_START) > prompt_tail.rfind(THINK_END)


__all__ = ["REASONING_PARSERS", "ReasoningParser", "ReasoningStream", "get_reasoning_parser", "pick_reasoning_parser",
           "prompt_opens_think"]
