"""Reading OpenAI's harmony format (gpt-oss), which the reasoning parser (openai_gptoss) and the tool-call parser
(openai) share. A reply is a run of messages, each a header, `<|message|>`, a body and an end token:

    <|channel|>analysis<|message|>Need the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>

The first message's `<|start|>assistant` is the prompt's; the recipient (`to=...`) may also stand before the
channel (`<|start|>assistant to=functions.f<|channel|>commentary json<|message|>`, as gpt-oss's chat template
writes past calls). The token that ends the reply (`<|call|>`, `<|return|>`) is not in the text."""

from __future__ import annotations

import re
from dataclasses import dataclass

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_HEADER_STARTS = (START, CHANNEL, "to=")
_CHANNEL_NAME = re.compile(r"<\|channel\|>\s*([^\s<]+)")
_RECIPIENT = re.compile(r"to=([^\s<]+)")


@dataclass
class HarmonyMessage:
    start: int  # where its header starts in the text
    channel: str | None
    recipient: str | None  # "functions.get_weather" for a function call; None for text meant for the user
    body: str  # as far as it is safe to show (a marker still arriving at the end is held back)
    header_done: bool  # `<|message|>` arrived: channel and recipient are whole
    closed: bool  # its end token arrived

    @property
    def function(self) -> str | None:
        """The function this message calls, if it is a function call."""
        if self.recipient and self.recipient.startswith("functions."):
            return self.recipient[len("functions."):]
        return None


def is_harmony(text: str, final: bool) -> bool | None:
    """Whether the reply is in harmony's markup (else it is plain text); None while that cannot be told yet."""
    body = text.lstrip()
    if body.startswith(_HEADER_STARTS):
        return True
    if not final and any(h.startswith(body) for h in _HEADER_STARTS):
        return None
    return False


def read_messages(text: str, final: bool, start: int = 0) -> list[HarmonyMessage]:
    """The messages of text (from start, where a header begins), the last possibly unfinished."""
    out: list[HarmonyMessage] = []
    pos = start
    while pos < len(text):
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            break
        head_start = pos
        if text.startswith(START, pos):
            pos += len(START)
        m = text.find(MESSAGE, pos)
        if m < 0:  # the header is still arriving
            out.append(HarmonyMessage(head_start, None, None, "", False, False))
            break
        header = text[pos:m]
        channel = _CHANNEL_NAME.search(header)
        recipient = _RECIPIENT.search(header)
        body_start = m + len(MESSAGE)
        ends = [(i, tok) for tok in (*_ENDS, START) if (i := text.find(tok, body_start)) >= 0]
        msg = HarmonyMessage(head_start, channel.group(1) if channel else None,
                             recipient.group(1) if recipient else None, "", True, False)
        out.append(msg)
        if not ends:
            msg.body = text[body_start:] if final else hold_back_marker(text[body_start:])
            break
        end, token = min(ends)
        msg.body, msg.closed = text[body_start:end], True
        pos = end if token == START else end + len(token)
    return out


def hold_back_marker(text: str) -> str:
    """text without a `<|...` marker that may still be arriving at its end."""
    i = text.rfind("<")
    if i >= 0 and "|>" not in text[i:] and (text[i:] == "<" or text[i:].startswith("<|")):
        return text[:i]
    return text


def call_markup(function: str, arguments: str, closed: bool) -> str:
    """A function call as harmony writes it: what the reasoning parser hands the openai tool parser."""
    return f"{CHANNEL}commentary to=functions.{function} <|constrain|>json{MESSAGE}{arguments}" + (
        "<|call|>" if closed else "")
