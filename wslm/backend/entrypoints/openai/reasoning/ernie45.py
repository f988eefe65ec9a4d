"""ERNIE-4.5 thinking models (vLLM's name: ernie45): DeepSeek-R1's reading (the reply starts inside the think
block), and the answer after `</think>` may be wrapped as `\n\n<response>\n...\n</response>\n`; the content is
then what the tags enclose (as vLLM's parser returns it), the tags never shown."""

from __future__ import annotations

from wslm.backend.entrypoints.openai.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from wslm.backend.entrypoints.openai.tool_parsers.json_scan import partial_suffix

RESPONSE = "<response>"
RESPONSE_END = "</response>"


class Ernie45ReasoningParser(DeepSeekR1ReasoningParser):
    name = "ernie45"
    # Kept in the text when the tokenizer marks them special (else detokenizing would drop them).
    markers = ("</think>", RESPONSE, RESPONSE_END)

    def split(self, text: str, final: bool) -> tuple[str, str]:
        reasoning, content = super().split(text, final)
        lead = content.lstrip("\n")
        if not lead.startswith(RESPONSE):
            if not final and RESPONSE.startswith(lead):
                return reasoning, ""  # maybe `<response>`, still arriving
            return reasoning, content
        inner = lead[len(RESPONSE):]
        end = inner.find(RESPONSE_END)
        if end >= 0:
            return reasoning, inner[:end]
        return reasoning, inner if final else inner[: len(inner) - partial_suffix(inner, RESPONSE_END)]
