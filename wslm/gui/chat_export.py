"""A conversation as a Markdown document or a JSON file (OpenAI-style messages plus what the app kept)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from wslm.gui.chat_store import ChatStore, Conversation, Message
from wslm.gui.content_parts import message_content


def to_markdown(conv: Conversation, messages: list[Message]) -> str:
    lines = [f"# {conv.title}", ""]
    meta = [f"Model: {conv.model}" if conv.model else "", time.strftime("%Y-%m-%d %H:%M", time.localtime(conv.created))]
    lines += [" · ".join(m for m in meta if m), ""]
    if conv.system_prompt.strip():
        lines += ["**System:**", "", conv.system_prompt.strip(), ""]
    for msg in messages:
        if msg.role == "tool":  # an MCP tool call's result (its call is in the assistant message before it)
            lines += [f"**Tool `{msg.stats.get('tool') or msg.stats.get('function')}`"
                      f" ({msg.stats.get('server') or 'no server'}), {msg.stats.get('state', 'done')}:**", "",
                      "```", msg.content.strip(), "```", ""]
            continue
        lines += [f"## {'You' if msg.role == 'user' else 'Assistant'}", ""]
        thought = msg.stats.get("reasoning")
        if thought:
            secs = msg.stats.get("reasoning_s")
            head = f"Thought for {secs:.1f} s" if secs is not None else "Thought"
            lines += [f"<details><summary>{head}</summary>", "", thought.strip(), "", "</details>", ""]
        for call in msg.stats.get("tool_calls") or []:
            lines += [f"Tool call `{call.get('name')}`:", "", "```json", str(call.get("arguments") or ""), "```", ""]
        if msg.content:
            lines += [msg.content.strip(), ""]
        for im in msg.images:  # inline (data: URLs): the export is whole without the app's database
            lines += [f"![{im.name or 'image'}]({im.data_url()})", ""]
        if msg.error:
            lines += [f"> Error: {msg.error}", ""]
    return "\n".join(lines).rstrip() + "\n"


def to_json(conv: Conversation, messages: list[Message]) -> str:
    data = {
        "title": conv.title,
        "model": conv.model,
        "created": conv.created,
        "parameters": {"temperature": conv.temperature, "top_p": conv.top_p, "max_tokens": conv.max_tokens,
                       **_sampling_set(conv)},
        "messages": ([{"role": "system", "content": conv.system_prompt}] if conv.system_prompt.strip() else [])
        + [_message(m) for m in messages],
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _sampling_set(conv: Conversation) -> dict:
    """The optional sampling the chat set (what it left unset was the server's default)."""
    out = {k: getattr(conv, k) for k in ("top_k", "min_p", "repetition_penalty", "seed", "reasoning")
           if getattr(conv, k) is not None}
    if conv.stop:
        out["stop"] = list(conv.stop)
    if conv.json_mode:
        out["json_mode"] = True
    return out


def _message(msg: Message) -> dict:
    out: dict = {"role": msg.role, "content": message_content(msg.content, msg.images)}
    if msg.role == "tool" and msg.stats.get("tool_call_id"):
        out["tool_call_id"] = msg.stats["tool_call_id"]
    if msg.stats.get("reasoning"):
        out["reasoning_content"] = msg.stats["reasoning"]
    if msg.stats.get("tool_calls"):
        out["tool_calls"] = [{"id": c.get("id") or f"call_{i}", "type": "function",
                              "function": {"name": c.get("name"), "arguments": c.get("arguments")}}
                             for i, c in enumerate(msg.stats["tool_calls"])]
    stats = {k: v for k, v in msg.stats.items() if k not in ("reasoning", "tool_calls", "versions")}
    if stats:
        out["stats"] = stats
    if msg.error:
        out["error"] = msg.error
    return out


def export_conversation(store: ChatStore, conv_id: int, path: Path) -> Path:
    """Write the chat to `path`: JSON for a .json file, else Markdown."""
    conv = store.get_conversation(conv_id)
    if conv is None:
        raise ValueError(f"no chat with id {conv_id}")
    messages = store.messages(conv_id)
    text = to_json(conv, messages) if Path(path).suffix.lower() == ".json" else to_markdown(conv, messages)
    Path(path).write_text(text, encoding="utf-8")
    return Path(path)
