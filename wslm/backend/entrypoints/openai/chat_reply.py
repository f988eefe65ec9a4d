"""One chat choice's reply taken apart as the model wrote it: reasoning (reasoning/), then tool calls
(tool_parsers/) out of what is left, then plain content. Streaming feeds it each engine delta; a non-streamed
reply feeds it the whole text at once, so both carry the same reasoning, content and calls."""

from __future__ import annotations

from typing import Any

from wslm.backend.entrypoints.openai.reasoning import ReasoningParser, ReasoningStream
from wslm.backend.entrypoints.openai.tool_parsers import ToolCallStream, ToolParser


class ChatReply:
    def __init__(self, reasoning: ReasoningParser | None = None, tools: ToolParser | None = None,
                 parallel_tool_calls: bool = True) -> None:
        self.text = ""
        self.reasoning = ReasoningStream(reasoning) if reasoning is not None else None
        self.tools = ToolCallStream(tools, parallel_tool_calls) if tools is not None else None
        self.content = ""

    @property
    def called_tools(self) -> bool:
        return self.tools is not None and self.tools.called

    def feed(self, text: str, final: bool) -> list[dict]:
        """The `delta` objects for this piece of the reply: one with reasoning_content/content (if any), then one
        per tool-call piece (OpenAI streams each on its own)."""
        self.text += text
        first: dict[str, Any] = {}
        if self.reasoning is not None:
            reasoning, content = self.reasoning.update(self.text, final)
            if reasoning:
                # vLLM sends the text as `reasoning` since 0.10 and older clients read `reasoning_content`.
                first["reasoning_content"] = first["reasoning"] = reasoning
        else:
            content = self.text
        calls: list[dict] = []
        if self.tools is not None:
            new_content, calls = self.tools.update(content, final)
        else:
            new_content = content[len(self.content):]
        if new_content:
            self.content += new_content
            first["content"] = new_content
        return ([first] if first else []) + [{"tool_calls": [c]} for c in calls]

    def message(self) -> dict:
        """The assistant message of a non-streamed reply, once everything was fed with final=True."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            msg["reasoning_content"] = self.reasoning.reasoning or None
            if not self.content:
                msg["content"] = None
        if self.called_tools:
            msg["tool_calls"] = self.tools.tool_calls()
            if not self.content:
                msg["content"] = None
        return msg

    def finish_reason(self, engine_reason: str | None) -> str | None:
        """OpenAI's finish_reason: "tool_calls" when the model stopped after calling tools."""
        return "tool_calls" if engine_reason == "stop" and self.called_tools else engine_reason
