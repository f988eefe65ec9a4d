"""GPT-OSS (vLLM's name: openai_gptoss): the harmony format writes the reasoning in an `analysis` channel and the
answer in a `final` one, `<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...`.
The markers are special tokens, so the server keeps special tokens in the text while this parser runs
(serving_tools.plan_chat) and this parser leaves none of them in either part. A reply cut inside the analysis
returns what was thought; a reply with no channel markers at all is content."""

from __future__ import annotations

import re

from wslm.backend.server.reasoning.base import ReasoningParser

ANALYSIS = "<|channel|>analysis<|message|>"
FINAL = "<|channel|>final<|message|>"
CHANNEL = "<|channel|>"
END = "<|end|>"
# Harmony's markup between and after the messages (<|start|>assistant, <|return|>, ...), never shown.
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
        body = text.lstrip()
        if CHANNEL not in body:
            if not final and CHANNEL.startswith(body[: len(CHANNEL)]):
                return "", ""  # a channel marker may be arriving
            return "", _clean(text, final)
        reasoning = ""
        a, f = body.find(ANALYSIS), body.find(FINAL)
        if a >= 0 and (f < 0 or a < f):
            stop = body.find(END, a)
            reasoning = body[a + len(ANALYSIS) : stop if stop >= 0 else (f if f >= 0 else len(body))]
            reasoning = _clean(reasoning, final or stop >= 0 or f >= 0)
        content = _clean(body[f + len(FINAL) :], final) if f >= 0 else ""
        return reasoning, content


def _clean(text: str, final: bool) -> str:
    """text without harmony's markup; while streaming, a marker still arriving at the end is held back."""
    if not final:
        start = text.rfind("<")
        if start >= 0 and "|>" not in text[start:] and (text[start:] == "<" or text[start:].startswith("<|")):
            text = text[:start]
    return _MARKUP.sub("", text)
