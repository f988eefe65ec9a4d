"""Wires MCP into a chat: the one call the chat panel (or the main window) makes.

    from wslm.gui.mcp_chat import connect_chat
    connect_chat(panel, panel.session, panel.view, mcp_service)

After it, each chat request offers the enabled MCP servers' tools, a call asks first (a dialog over `parent`;
the card's own links answer too), runs, and shows its card; the model then goes on from the result."""

from __future__ import annotations

from PySide6.QtWidgets import QWidget

from wslm.gui.mcp_confirm import ask_tool_confirmation
from wslm.gui.tool_loop import ToolLoop


def connect_chat(parent: QWidget, session, view, service, confirm: bool = True) -> ToolLoop:
    """Give `session` (ChatSession) a tool loop over `service` (McpService); `view` (ChatView) answers from
    its cards. `confirm`: ask in a dialog as well (False: the cards' links alone)."""
    loop = ToolLoop(session, service)
    session.tool_loop = loop
    view.tool_answer.connect(loop.answer)
    if confirm:
        loop.confirmation_needed.connect(lambda request: _ask(parent, loop, request))
    return loop


def _ask(parent: QWidget, loop: ToolLoop, request: dict) -> None:
    dialog = ask_tool_confirmation(parent, request, loop.answer)
    loop.answered.connect(dialog.reject)  # answered on the card instead: the question goes away
