"""GPT-OSS (vLLM's name: openai_gptoss): the harmony format writes the reasoning in an `analysis` channel and the
answer in a `final` one, `<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...`
(tool_parsers/harmony.py reads it). The markers are special tokens, so the server keeps special tokens in the
text while this parser runs (serving_tools.plan_chat) and this parser leaves none of them in reasoning or text.
`commentary` text without a recipient (a preamble to the user) is content; a function call
(`to=functions.NAME`) stays in the content as harmony markup, for the openai tool-call parser to turn into
tool_calls. A reply cut inside the analysis returns what was thought; a reply with no harmony markup at all
(a grammar forced it) is content."""

from __future__ import annotations

import re

from wslm.backend.entrypoints.openai.reasoning.base import ReasoningParser
from wslm.backend.entrypoints.openai.tool_parsers.harmony import (
    call_markup,
    hold_back_marker,
    is_harmony,
    read_messages,
)

ANALYSIS = "<|channel|>analysis<|message|>"
# Harmony's markup left in a plain reply (<|start|>assistant, <|return|>, ...), never shown.
_MARKUP = re.compile(r"<\|(start|end|return|call|channel|message|constrain)\|>(assistant)?")


class GptOssReasoningParser(ReasoningParser):
    name = "openai_gptoss"
    # Harmony's marker tokens: when the tokenizer has them as special tokens, the server keeps special tokens
    # in the text so that this parser sees them.
    markers = ("<|channel|>", "<|message|>", "<|end|>")
    think_tags = False  # a constraint applies from the first token (a grammar cannot write channel tokens)

    def starts_inside(self, text: str) -> bool:
        return text.lstrip().startswith(ANALYSIS)

    def split(self, text: str, final: bool) -> tuple[str, str]:
        harmony = is_harmony(text, final)
        if harmony is None:
            return "", ""  # a header may be arriving
        if not harmony:
            return "", _MARKUP.sub("", text if final else hold_back_marker(text))
        reasoning: list[str] = []
        content: list[str] = []
        calls = ""
        for msg in read_messages(text, final, len(text) - len(text.lstrip())):
            if not msg.header_done:
                continue
            if msg.function is not None:
                calls += call_markup(msg.function, msg.body, msg.closed)
            elif msg.recipient is not None:
                continue  # a built-in tool's call (browser, python): nothing wslm runs
            elif msg.channel == "analysis":
                reasoning.append(msg.body)
            elif not calls:  # final, or commentary meant for the user; text after a call has no place
                content.append(msg.body)
        # Messages are joined by a newline, added only once the next one has begun, so the text only grows.
        return "\n".join(reasoning), "\n".join(content) + calls
