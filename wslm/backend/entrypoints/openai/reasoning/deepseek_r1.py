"""DeepSeek-R1 (and its distills, QwQ): the reply starts inside the think block (the template opens it), so all
text before `</think>` is reasoning, with or without a `<think>` of its own."""

from __future__ import annotations

from wslm.backend.entrypoints.openai.reasoning.base import ReasoningParser


class DeepSeekR1ReasoningParser(ReasoningParser):
    name = "deepseek_r1"
    always_inside = True

    def starts_inside(self, text: str) -> bool:
        return True
