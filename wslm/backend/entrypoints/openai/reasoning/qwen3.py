"""Qwen3: the model opens the think block itself (`<think>` ... `</think>`), or the prompt opened it (the
thinking-2507 templates); with `enable_thinking: false` the template writes an empty block into the prompt and
the reply is all content."""

from __future__ import annotations

from wslm.backend.entrypoints.openai.reasoning.base import THINK_START, ReasoningParser


class Qwen3ReasoningParser(ReasoningParser):
    name = "qwen3"

    def starts_inside(self, text: str) -> bool:
        return self.opened or text.lstrip().startswith(THINK_START)
