"""Reasoning parsers: the text a model writes between `<think>` and `</think>` goes to `reasoning_content`,
never to `content`. ReasoningStream turns successive splits of the growing reply into deltas; a non-streamed
reply runs through it in one go, so both shapes split alike, and a reply cut inside the think block still
returns what was thought."""

from __future__ import annotations

from wslm.backend.entrypoints.openai.tool_parsers.json_scan import partial_suffix

THINK_START = "<think>"
THINK_END = "</think>"


class ReasoningParser:
    """opened: the prompt already opened the think block (DeepSeek-R1's and Qwen3-2507's templates end the
    prompt with `<think>`), so the reply starts inside it."""

    name = ""
    markers: tuple[str, ...] = ()  # tokens the parser must see in the text (kept when they are special tokens)
    # The reasoning sits in a `<think>` ... `</think>` block (harmony's channels do not): a structured-output
    # constraint then applies after `</think>` (serving_tools.ChatPlan.after_reasoning).
    think_tags = True
    always_inside = False  # every reply starts inside the think block (DeepSeek-R1's reading)

    def __init__(self, opened: bool = False) -> None:
        self.opened = opened

    def starts_inside(self, text: str) -> bool:
        """Whether the reply's first text is reasoning (until a `</think>`)."""
        raise NotImplementedError

    def split(self, text: str, final: bool) -> tuple[str, str]:
        """(reasoning, content) of the reply so far; a partial tag at the end is held back unless final."""
        lead = len(text) - len(text.lstrip())
        body = text[lead:]
        inside = self.starts_inside(text)
        if body.startswith(THINK_START):
            body = body[len(THINK_START):]
        elif not final and body and THINK_START.startswith(body):
            return "", ""  # maybe `<think>`, still arriving
        elif not inside:
            return "", text if final else text[: len(text) - partial_suffix(text, THINK_START)]
        else:
            body = text
        end = body.find(THINK_END)
        if end >= 0:
            return body[:end], body[end + len(THINK_END):]
        return (body if final else body[: len(body) - partial_suffix(body, THINK_END)]), ""


class ReasoningStream:
    """One choice's reasoning split: update() with the whole text so far returns the new (reasoning, content)."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        self.reasoning_sent = 0
        self.content_sent = 0
        self.reasoning = ""
        self.content = ""

    def update(self, text: str, final: bool) -> tuple[str, str]:
        reasoning, content = self.parser.split(text, final)
        new_reasoning = reasoning[self.reasoning_sent:] if len(reasoning) > self.reasoning_sent else ""
        self.reasoning_sent = max(self.reasoning_sent, len(reasoning))
        self.reasoning += new_reasoning
        self.content = content  # the tool parser takes the content whole; the caller diffs it
        return new_reasoning, content
