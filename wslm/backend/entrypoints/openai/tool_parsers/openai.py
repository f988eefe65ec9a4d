"""gpt-oss's harmony tool calls (vLLM's name: openai): a message to a function on the commentary channel,

    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

after any text for the user. The openai_gptoss reasoning parser has already taken the analysis channel out and
left calls in this form (tool_parsers/harmony.py reads both). The arguments are the message body as the model
wrote it (JSON for a `json` call), streamed as it grows; the name is whole once `<|message|>` arrived."""

from __future__ import annotations

from wslm.backend.entrypoints.openai.tool_parsers.base import Parse, ParsedCall, ToolParser
from wslm.backend.entrypoints.openai.tool_parsers.harmony import CHANNEL, START, read_messages
from wslm.backend.entrypoints.openai.tool_parsers.json_scan import partial_suffix


class OpenAIToolParser(ToolParser):
    name = "openai"
    markers = ("to=functions.",)
    output_markers = (CHANNEL, "<|message|>", "<|call|>")

    def parse(self, text: str, final: bool) -> Parse:
        first = _first_header(text)
        if first is None:
            held = 0 if final else max(partial_suffix(text, CHANNEL), partial_suffix(text, START))
            return Parse(len(text) - held)
        result = Parse(first)
        for msg in read_messages(text, final, first):
            if not msg.header_done:
                result.calls.append(ParsedCall(None, ""))  # the name may still be arriving
            elif msg.function is not None:
                result.calls.append(ParsedCall(msg.function, msg.body.lstrip()))
        return result


def _first_header(text: str) -> int | None:
    """Where the first harmony message header starts (content before it is for the user)."""
    found = [i for i in (text.find(CHANNEL), text.find(START)) if i >= 0]
    if text.lstrip().startswith("to="):
        found.append(len(text) - len(text.lstrip()))
    return min(found) if found else None
