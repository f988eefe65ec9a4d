"""The chat's tool-call loop: the enabled MCP servers' tools go into each chat request (OpenAI `tools`); when
the model calls one, the user is asked (allow once / always for this tool / deny), the call runs off the GUI
thread, its result is shown as a card and sent back as a `tool` message, and the model goes on.

Each call is a "tool" message in the chat (the row after the assistant's call), whose stats hold the call
and its state; the card renders it (mcp_cards.py). A timeout, a failed or dead server, a denied call are
results too: the chat goes on with them."""

from __future__ import annotations

import itertools
import json
import time

from PySide6.QtCore import QObject, Signal

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.content_parts import message_content
from wslm.gui.context_fit import TYPICAL_BYTES_PER_TOKEN

MAX_TOOL_ROUNDS = 8  # calls in a row without the user's word: then the model must answer in text
CONFIRM, RUNNING = "confirm", "running"  # states of a call not finished yet
DONE, ERROR, FAILED, TIMEOUT, DENIED, CANCELLED = "done", "error", "failed", "timeout", "denied", "cancelled"
OPEN_STATES = (CONFIRM, RUNNING)
ONCE, ALWAYS, DENY = "once", "always", "deny"
NO_AUTO_MARK = "--enable-auto-tool-choice"  # the server's 400 for tool_choice "auto" without a parser
NO_AUTO_NOTE = ("MCP tools not offered: this server calls no tools by itself (start it with "
                "--enable-auto-tool-choice --tool-call-parser NAME, or use a model whose template it recognises)")
_ids = itertools.count(1)


def parse_arguments(text: str) -> tuple[dict | None, str]:
    """A call's JSON arguments as a dict, or None and why not."""
    if not text.strip():
        return {}, ""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return None, f"The arguments are not valid JSON ({exc}): {text[:200]}"
    if not isinstance(value, dict):
        return None, f"The arguments must be a JSON object, got: {text[:200]}"
    return value, ""


def tools_padding(fields: dict) -> list[dict]:
    """The tools' schemas take prompt tokens too (the chat template writes them out): a stand-in message of
    that many bytes for ChatSession.fitting_max_tokens, which counts a byte per token (the schemas' JSON is
    counted at TYPICAL_BYTES_PER_TOKEN: a byte per token would leave no room for a reply on a small context)."""
    if not fields.get("tools"):
        return []
    return [{"content": " " * int(len(json.dumps(fields["tools"])) / TYPICAL_BYTES_PER_TOKEN)}]


def _sendable(arguments: str) -> str:
    """A call's arguments as sent back: malformed ones (which servers refuse in history) become {} (the tool
    message answering the call quotes them and says what was wrong)."""
    return arguments if arguments.strip() and parse_arguments(arguments)[0] is not None else "{}"


def history_messages(items: list, skip_row: int = -1) -> list[dict]:
    """The request's messages for the chat's shown path, tool calls and results included: an assistant's
    tool_calls go only with the calls answered by a finished tool message (a call left unanswered, as when
    the app closed mid-call, is not sent: servers refuse a call without its answer)."""
    answered = {m.stats["tool_call_id"] for m in items
                if m.role == "tool" and m.stats.get("tool_call_id") and m.stats.get("state") not in OPEN_STATES}
    out: list[dict] = []
    for i, m in enumerate(items):
        if i == skip_row:
            continue
        if m.role == "user":
            out.append({"role": "user", "content": message_content(m.content, getattr(m, "images", None))})
        elif m.role == "assistant":
            calls = [c for c in m.stats.get("tool_calls") or [] if c.get("id") in answered]
            if calls and not m.error:
                out.append({"role": "assistant", "content": m.content, "tool_calls": [
                    {"id": c["id"], "type": "function",
                     "function": {"name": c.get("name") or "", "arguments": _sendable(c.get("arguments") or "")}}
                    for c in calls]})
            elif m.content:
                out.append({"role": "assistant", "content": m.content})
        elif m.role == "tool" and m.stats.get("tool_call_id") in answered:
            out.append({"role": "tool", "tool_call_id": m.stats["tool_call_id"], "content": m.content})
    return out


class ToolLoop(QObject):
    """Runs the calls of the open chat's replies through `service` (an mcp_service.McpService)."""

    confirmation_needed = Signal(dict)  # {"row", "function", "server", "tool", "arguments"}: answer(row, ...)
    calls_finished = Signal()  # every call of a reply has its result (the model is asked again next)
    answered = Signal(int)  # the call at this row got the user's answer (an open dialog for it closes)

    def __init__(self, session, service, parent=None) -> None:
        super().__init__(parent or session)
        self.session = session
        self.service = service
        self.forced: str | None = None  # force_next(): the next request makes the model call this tool
        self._no_auto: set[tuple[str, str]] = set()  # (URL, model) whose server has no tool-call parser
        self._queue: list[int] = []  # message ids of the open round's calls, in order
        self._conv = 0  # the chat whose round runs
        self._waiting: dict[str, int] = {}  # call id given to the service -> message id
        self._resume: int = 0  # a chat whose round ended while another chat was open: it goes on when opened
        # Chats whose reply called tools while they were not open (or while another chat's round ran): their
        # calls start when the chat is open and no other round runs.
        self.deferred: set[int] = set()
        self._info: dict[int, dict] = {}  # message id -> the call's stats (its chat may not be the open one)
        service.call_finished.connect(self._on_call_finished)
        session.current_changed.connect(self._on_opened)

    # The request
    def force_next(self, function: str | None) -> None:
        """Make the model call `function` in the next reply (tool_choice naming it): for models that do not
        pick tools themselves. Only that request: the model answers the result freely."""
        self.forced = function

    def request_fields(self, messages: list[dict], peek: bool = False) -> tuple[dict, str]:
        """The chat request's `tools` and `tool_choice`, and a note for under the reply ("" when none).
        `peek`: for a preview (the developer view), a forced tool stays for the real request."""
        tools = self.service.openai_tools()
        if not tools:
            return {}, ""
        forced = self.forced
        if not peek:
            self.forced = None
        if forced and any(t["function"]["name"] == forced for t in tools):
            return {"tools": tools, "tool_choice": {"type": "function", "function": {"name": forced}}}, ""
        rounds = 0
        for m in reversed(messages):  # calls since the user last spoke
            if m["role"] == "user":
                break
            rounds += m["role"] == "assistant" and bool(m.get("tool_calls"))
        if rounds >= MAX_TOOL_ROUNDS:
            return {"tools": tools, "tool_choice": "none"}, f"{rounds} tool calls in a row: the model answers now"
        if (self.session.base_url, self.session.model) in self._no_auto:
            return {}, ""
        return {"tools": tools, "tool_choice": "auto"}, ""

    def refused_auto(self, request_extra: dict, message: str) -> bool:
        """The server refused tool_choice "auto" (no tool-call parser): remember it for this server and model
        (the request is sent again without tools). True when that was the failure."""
        if request_extra.get("tool_choice") != "auto" or NO_AUTO_MARK not in message:
            return False
        self._no_auto.add((self.session.base_url, self.session.model))
        return True

    # The calls
    def active(self, conv_id: int) -> bool:
        return bool(self._queue) and conv_id == self._conv

    def handle(self, conv_id: int, row: int, stats: dict) -> bool:
        """The reply at `row` of the open chat ended with these stats: when it called tools, add a tool
        message per call and start on them. True when the loop took over (the chat is busy until done)."""
        calls = stats.get("tool_calls") or []
        if not calls:
            return False
        if conv_id != self.session.messages.conversation_id or self._queue:
            self.deferred.add(conv_id)
            return False
        messages = self.session.messages
        self._conv = conv_id
        for call in calls:
            function = str(call.get("name") or "")
            target = self.service.resolve(function)
            info = {"tool_call_id": call.get("id") or f"call_{next(_ids)}", "function": function,
                    "server": target[0] if target else "", "tool": target[1] if target else function,
                    "arguments": str(call.get("arguments") or ""), "state": CONFIRM}
            msg = messages.message(messages.append("tool", ""))
            msg.stats = info
            self._info[msg.id] = info
            self.session.store.update_message(msg.id, content="", stats=info, error="")
            self._queue.append(msg.id)
        self.session.busy_changed.emit(True)
        self._next()
        return True

    def pending_row(self) -> int:
        """The row of the call waiting for the user's answer (-1: none)."""
        if not self._queue or self._conv != self.session.messages.conversation_id:
            return -1
        row = self._row_of(self._queue[0])
        return row if row >= 0 and self._stats(self._queue[0]).get("state") == CONFIRM else -1

    def answer(self, row: int, decision: str) -> bool:
        """The user's answer to the call at `row`: ONCE, ALWAYS (this tool from now on) or DENY."""
        if row < 0 or row != self.pending_row():
            return False
        mid = self._queue[0]
        if decision == DENY:
            self._set(mid, "The user denied this tool call.", DENIED)
            self.answered.emit(row)  # after the state moved on: a dialog closing now answers nothing
            self._advance()
            return True
        if decision == ALWAYS:
            self.service.allow_always(self._stats(mid)["function"])
        self._run(mid)
        self.answered.emit(row)
        return True

    def cancel(self, conv_id: int) -> bool:
        """Stop: the open round's calls not finished are marked cancelled, and the model is not asked again."""
        if not self._queue or conv_id != self._conv:
            return False
        for mid in self._queue:
            self._set(mid, "Stopped by the user before the tool answered.", CANCELLED)
        self._queue.clear()
        self._waiting.clear()
        if conv_id == self.session.messages.conversation_id:
            self.session.busy_changed.emit(False)
        return True

    def _next(self) -> None:
        """Start on the round's first call: ask, or run it when always allowed; at the end, ask the model."""
        if not self._queue:
            self._round_done()
            return
        mid = self._queue[0]
        stats = self._stats(mid)
        args, why = parse_arguments(stats.get("arguments", ""))
        if not stats.get("server"):
            self._set(mid, f"No enabled MCP server offers a tool named {stats.get('function')!r}.", FAILED)
            self._advance()
        elif args is None:
            self._set(mid, why, FAILED)
            self._advance()
        elif self.service.is_always_allowed(stats["function"]):
            self._run(mid)
        else:
            self._ask()

    def _ask(self) -> None:
        """Ask about the round's first call, when its chat is open (else when it is opened again)."""
        row = self.pending_row()
        if row < 0:
            return
        stats = self._stats(self._queue[0])
        self.confirmation_needed.emit({"row": row, "function": stats["function"], "server": stats["server"],
                                       "tool": stats["tool"], "arguments": parse_arguments(stats["arguments"])[0]})

    def _advance(self) -> None:
        if self._queue:
            self._queue.pop(0)
        self._next()

    def _run(self, mid: int) -> None:
        stats = self._stats(mid)
        args, _ = parse_arguments(stats.get("arguments", ""))
        self._set(mid, "", RUNNING, started=time.time())
        call_id = f"{mid}:{next(_ids)}"
        self._waiting[call_id] = mid
        self.service.call(call_id, stats["function"], args or {})

    def _on_call_finished(self, call_id: str, result: dict) -> None:
        mid = self._waiting.pop(call_id, None)
        if mid is None or not self._queue or self._queue[0] != mid:
            return  # cancelled meanwhile
        state = {"ok": DONE, "error": ERROR, "timeout": TIMEOUT}.get(result.get("kind"), FAILED)
        started = self._stats(mid).get("started")
        self._set(mid, str(result.get("text") or ""), state,
                  elapsed_s=round(time.time() - started, 2) if started else None)
        self._advance()

    def _round_done(self) -> None:
        conv = self._conv
        self._conv = 0
        if conv == self.session.messages.conversation_id:
            self.calls_finished.emit()
            self.session.continue_after_tools()
        else:
            self._resume = conv
            if self.session.messages.conversation_id in self.deferred:  # the open chat's calls waited for this
                self._on_opened(self.session.messages.conversation_id)

    def _on_opened(self, conv_id: int) -> None:
        if conv_id and conv_id == self._resume and not self._queue:
            self._resume = 0
            self.session.continue_after_tools()
        elif conv_id in self.deferred and not self._queue:
            self.deferred.discard(conv_id)
            row = self.session.messages.rowCount() - 1
            last = self.session.messages.message(row)
            if last is not None and last.role == "assistant" and not last.error and not self.session.busy:
                self.handle(conv_id, row, last.stats)
        elif conv_id and conv_id == self._conv and self._queue:
            self.session.busy_changed.emit(True)
            self._ask()

    # The tool messages
    def _row_of(self, mid: int) -> int:
        if self._conv != self.session.messages.conversation_id:
            return -1
        return next((i for i, m in enumerate(self.session.messages.messages()) if m.id == mid), -1)

    def _stats(self, mid: int) -> dict:
        return self._info.get(mid, {})

    def _set(self, mid: int, content: str, state: str, **more) -> None:
        """Update a call's message, in the view when its chat is open, in the store in any case."""
        stats = {**self._stats(mid), "state": state, **{k: v for k, v in more.items() if v is not None}}
        self._info[mid] = stats
        row = self._row_of(mid)
        msg = self.session.messages.message(row)
        if msg is not None:
            msg.content = content
            self.session.messages.finish(row, stats)
        else:
            self.session.store.update_message(mid, content=content, stats=stats, error="")
