"""Reasoning parsers (vLLM's names: deepseek_r1, qwen3, openai_gptoss), one file each, vLLM's other names for
the same formats, and the registry that picks one by name or from the chat template."""

from __future__ import annotations

from wslm.backend.entrypoints.openai.reasoning.base import (
    THINK_END,
    THINK_START,
    ReasoningParser,
    ReasoningStream,
)
from wslm.backend.entrypoints.openai.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from wslm.backend.entrypoints.openai.reasoning.ernie45 import Ernie45ReasoningParser
from wslm.backend.entrypoints.openai.reasoning.gpt_oss import GptOssReasoningParser
from wslm.backend.entrypoints.openai.reasoning.qwen3 import Qwen3ReasoningParser

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "qwen3": Qwen3ReasoningParser,
    "openai_gptoss": GptOssReasoningParser,
    # vLLM's parsers for other models whose replies have one of these formats (checked against vLLM's source):
    # `...</think>` with the reply starting inside the block, `<think>` optional (vLLM's BaseThinking parsers),
    "step3": DeepSeekR1ReasoningParser,
    "minimax_m2": DeepSeekR1ReasoningParser,
    "ernie45": Ernie45ReasoningParser,  # and its answer may sit in <response>...</response>
    # and a block the model opens itself, or the prompt opened (enable_thinking / thinking switches).
    "glm45": Qwen3ReasoningParser,
    "deepseek_v3": Qwen3ReasoningParser,
}

# vLLM's reasoning parsers for formats wslm does not split (other tags or extra answer markup), and what each
# model writes, for the error that names them.
UNSUPPORTED_REASONING_PARSERS: dict[str, str] = {
    "granite": "Granite's 'Here is my thought process:' / 'Here is my response:'",
    "hunyuan_a13b": "Hunyuan-A13B's <think>...</think><answer>...</answer>",
    "mistral": "Magistral's [THINK]...[/THINK]",
    "seed_oss": "Seed-OSS's <seed:think>...</seed:think>",
    "minimax_m2_append_think": "MiniMax-M2 with the reasoning left in the content",
}


def check_reasoning_parser_name(name: str) -> str:
    """name when wslm has that reasoning parser, else a ValueError naming what is supported."""
    if name in REASONING_PARSERS:
        return name
    what = UNSUPPORTED_REASONING_PARSERS.get(name)
    why = f"vLLM's {name!r} parses {what}, a format wslm does not split" if what else \
        f"wslm has no reasoning parser {name!r}"
    raise ValueError(f"{why}. Supported: {', '.join(REASONING_PARSERS)}; or leave --reasoning-parser out and the "
                     "reasoning stays in the content.")


def get_reasoning_parser(name: str, opened: bool = False) -> ReasoningParser:
    return REASONING_PARSERS[check_reasoning_parser_name(name)](opened)


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


__all__ = ["REASONING_PARSERS", "UNSUPPORTED_REASONING_PARSERS", "ReasoningParser", "check_reasoning_parser_name", "ReasoningStream", "get_reasoning_parser", "pick_reasoning_parser",
           "prompt_opens_think"]
