"""A tool call in the transcript: a card with the tool's name, its server, the arguments and the result (or
the error, the timeout, the denial), folded to one line once it has finished; HTML for chat_view's
QTextBrowser. While the call waits for the user, the card offers the answers as links
(toolans:ROW:once|always|deny); "toolcard:ROW" folds and unfolds it."""

from __future__ import annotations

import html
import json

from wslm.gui import theme
from wslm.gui.chat_store import Message
from wslm.gui.markdown import render_markdown
from wslm.gui.tool_loop import (
    ALWAYS,
    CANCELLED,
    CONFIRM,
    DENIED,
    DENY,
    DONE,
    ERROR,
    FAILED,
    ONCE,
    RUNNING,
    TIMEOUT,
)

CARD_BG = "#161d2a"
ERROR_BG = "#2a1517"
RESULT_PREVIEW = 80  # characters of the result on the folded line

_HEAD = {  # state -> (icon, words, colour)
    CONFIRM: ("🔧", "wants to call", theme.ACCENT),
    RUNNING: ("⏳", "calling", theme.ACCENT),
    DONE: ("✓", "called", theme.MUTED),
    ERROR: ("⚠", "tool error from", theme.ERROR),
    FAILED: ("⚠", "failed:", theme.ERROR),
    TIMEOUT: ("⌛", "timed out:", theme.ERROR),
    DENIED: ("⛔", "denied:", theme.MUTED),
    CANCELLED: ("■", "stopped:", theme.MUTED),
}


def _short(text: str, limit: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def pretty_arguments(text: str) -> str:
    """JSON shown indented; anything else as it is."""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def _code(text: str, lang: str, row: int) -> str:
    return render_markdown(f"```{lang}\n{text}\n```", f"copycode:{row}:")


def card_blocks(msg: Message) -> list[str]:
    """The texts the card's Copy links copy, in the order of its code blocks: the arguments, the result."""
    blocks = [pretty_arguments(str(msg.stats.get("arguments") or "{}"))]
    if msg.stats.get("state") not in (CONFIRM, RUNNING):
        blocks.append(msg.content)
    return blocks


def tool_card_html(row: int, msg: Message, unfolded: bool) -> str:
    """The card of the tool message at `row`. Unfolded (or not finished yet): arguments and result in full."""
    stats = msg.stats
    state = str(stats.get("state") or DONE)
    icon, words, colour = _HEAD.get(state, _HEAD[DONE])
    name = html.escape(str(stats.get("tool") or stats.get("function") or "tool"))
    server = html.escape(str(stats.get("server") or "no server"))
    live = state in (CONFIRM, RUNNING)
    show = unfolded or live
    fold = "" if live else ("▾ " if show else "▸ ")
    head = (f'<a href="toolcard:{row}" style="color:{colour}; font-weight:600;">{fold}{icon} {words} '
            f'<b>{name}</b></a> <span style="color:{theme.MUTED};">· {server}</span>')
    if stats.get("elapsed_s") is not None and not live:
        head += f' <span style="color:{theme.MUTED};">· {float(stats["elapsed_s"]):.2f} s</span>'
    if not show and msg.content:
        head += f' <span style="color:{theme.MUTED};">→ {html.escape(_short(msg.content, RESULT_PREVIEW))}</span>'
    parts = [f'<p style="margin:0 0 4px 0;">{head}</p>']
    if show:
        parts.append(f'<p style="color:{theme.MUTED}; margin:4px 0 2px 0;">Arguments</p>')
        parts.append(_code(pretty_arguments(str(stats.get("arguments") or "{}")), "json", row))
        if state == CONFIRM:
            parts.append(
                f'<p style="margin-top:6px;">Run it? &nbsp;<a href="toolans:{row}:{ONCE}" style="color:{theme.ACCENT};">'
                f'Allow once</a> &nbsp;·&nbsp; <a href="toolans:{row}:{ALWAYS}">Always allow {name}</a>'
                f' &nbsp;·&nbsp; <a href="toolans:{row}:{DENY}">Deny</a></p>')
        elif state == RUNNING:
            parts.append(f'<p style="color:{theme.MUTED}; margin-top:6px;">Waiting for the tool…</p>')
        else:
            label = "Result" if state == DONE else "Error" if state in (ERROR, FAILED, TIMEOUT) else "Sent to the model"
            parts.append(f'<p style="color:{theme.MUTED}; margin:6px 0 2px 0;">{label}</p>')
            pretty = pretty_arguments(msg.content) if state == DONE else msg.content
            parts.append(_code(pretty, "json" if pretty != msg.content or msg.content.strip() in ("{}", "[]") else "text",
                               row))
    bg = ERROR_BG if state in (ERROR, FAILED, TIMEOUT) else CARD_BG
    return (f'<table width="100%" cellspacing="0" cellpadding="10" style="background-color:{bg}; '
            f'margin-bottom:6px;"><tr><td>{"".join(parts)}</td></tr></table>')
