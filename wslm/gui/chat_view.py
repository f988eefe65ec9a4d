"""The transcript: renders the message model as HTML in a QTextBrowser, re-rendering (throttled) as it changes.

Per-message actions are links (copy:ROW, regen:ROW, ver:ROW:INDEX, …) so the view stays one widget; only the streaming
message is re-converted from Markdown on each update, the others come from a cache."""

from __future__ import annotations

import html
import json

from PySide6.QtCore import Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication, QTextCursor
from PySide6.QtWidgets import QPushButton, QTextBrowser

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui import theme
from wslm.gui.attachments_view import sources_html
from wslm.gui.chat_model import MessageListModel
from wslm.gui.chat_store import is_cut_short
from wslm.gui.markdown import code_blocks, render_markdown
from wslm.gui.mcp_cards import card_blocks, tool_card_html

RENDER_DELAY_MS = 40
NEAR_BOTTOM_PX = 40  # this close to the end counts as at the end (follows new text, no jump button)


def stats_line(stats: dict) -> str:
    parts = []
    if stats.get("tokens_per_s"):
        parts.append(f"{stats['tokens_per_s']:.1f} tok/s")
    if stats.get("tokens"):
        parts.append(f"{stats['tokens']} tokens")
    if stats.get("ttft_s") is not None:
        parts.append(f"TTFT {stats['ttft_s']:.2f} s")
    if stats.get("model"):
        parts.append(str(stats["model"]))
    if stats.get("context_note"):
        parts.append(str(stats["context_note"]))
    if stats.get("cut"):
        parts.append("cut off: the app closed during this reply")
    elif stats.get("interrupted"):
        parts.append(f"interrupted: {stats['interrupted']}")
    elif stats.get("stopped"):
        parts.append("stopped")
    elif stats.get("finish_reason") == "length":
        parts.append("hit max tokens")
    return " · ".join(parts)


def json_reply(text: str) -> str | None:
    """A reply that is one JSON object or array (structured output), pretty-printed; None otherwise."""
    t = text.strip()
    if not t.startswith(("{", "[")):
        return None
    try:
        return json.dumps(json.loads(t), indent=2, ensure_ascii=False)
    except ValueError:
        return None


def pretty_arguments(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except ValueError:
        return arguments


def card_html(title: str, body_html: str, kind: str = "info", links: str = "") -> str:
    """A card in the transcript (a tool call to confirm, its result, a timeout): a tinted box with a bold
    title, the body (HTML, escaped by the caller) and a line of links ("allow:3:0" …) under it."""
    bg, color = {"error": ("#2a1517", theme.ERROR), "warn": ("#2a2313", theme.WARN)}.get(kind, ("#161a22", theme.ACCENT))
    foot = f'<br><span style="font-size:small;">{links}</span>' if links else ""
    return (f'<table width="100%" cellpadding="10" style="background-color:{bg}; margin:6px 0;"><tr><td>'
            f'<span style="color:{color}; font-weight:600;">{html.escape(title)}</span><br>{body_html}{foot}'
            "</td></tr></table>")


class ChatView(QTextBrowser):
    regenerate_requested = Signal(int)
    edit_requested = Signal(int)  # a user message's row: put it back in the message box
    branch_requested = Signal(int, int)  # row, index among the branches there (‹ 2/3 ›)
    continue_requested = Signal(int)  # a cut reply's row: ask for the rest
    delete_requested = Signal(int)  # a message's row: delete it from the chat
    notice = Signal(str)  # a brief confirmation for the status bar ("Copied")
    tool_answer = Signal(int, str)  # a tool call's row, the user's answer on its card (tool_loop.ONCE/ALWAYS/DENY)

    def __init__(self, model: MessageListModel, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("Transcript")
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.anchorClicked.connect(self._on_link)
        self.model = model
        self.empty_hint = ""
        self.open_thoughts: set[int] = set()  # message ids whose reasoning is unfolded
        self.open_tools: set[tuple[int, int]] = set()  # (message id, call index) unfolded
        self.open_sources: set[tuple[int, int]] = set()  # (message id, source index): its passage unfolded
        self.open_cards: set[int] = set()  # tool messages (ids) whose card is unfolded
        self._cache: dict[tuple[int, int, str], str] = {}
        # Hooks for other parts (MCP tool calls, documents): extra HTML per message (cards), and the links
        # of their own they put there ("allow:ROW:I" -> handler("ROW:I")). See add_message_part().
        self._parts: list = []
        self._link_handlers: dict[str, object] = {}
        self._timer = QTimer(self, singleShot=True, interval=RENDER_DELAY_MS)
        self._timer.timeout.connect(self.render)
        # Follow the end of the transcript (as chat apps do) until the user scrolls up; the document
        # lays out lazily and the view resizes, so re-apply on every range change.
        self._follow = True
        bar = self.verticalScrollBar()
        # Only the user's own scrolling (wheel, drag, keys: scroll bar actions) changes whether we follow;
        # Qt moves the value itself on setHtml and while laying out. Decided at once, from where the action
        # goes (sliderPosition; the value follows it just after): a deferred check lost to a range change
        # in between, which snapped the view back to the end.
        bar.actionTriggered.connect(self._on_user_scrolled)
        bar.sliderReleased.connect(self._on_user_scrolled)
        bar.rangeChanged.connect(self._on_range)
        # Scrolled up in a long chat: a floating button goes back to the end (and follows again). A child of
        # the scroll area, not of its viewport, so it stays put while the text scrolls under it.
        self.jump_button = QPushButton("Jump to latest ↓", self)
        self.jump_button.setObjectName("JumpToLatest")
        self.jump_button.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.jump_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.jump_button.setStyleSheet(
            f"QPushButton {{ background-color: {theme.RAISED}; color: {theme.TEXT}; border: 1px solid {theme.BORDER};"
            f" border-radius: 14px; padding: 5px 14px; }} QPushButton:hover {{ border-color: {theme.ACCENT}; }}")
        self.jump_button.clicked.connect(self.jump_to_latest)
        self.jump_button.hide()
        bar.valueChanged.connect(self._update_jump)
        bar.rangeChanged.connect(self._update_jump)
        model.modelReset.connect(self._on_reset)
        for sig in (model.rowsInserted, model.rowsRemoved, model.dataChanged):
            sig.connect(self.schedule)
        self.document().setDefaultStyleSheet(
            f"a {{ color: {theme.MUTED}; text-decoration: none; }} pre {{ margin: 0; }} p {{ margin: 0 0 6px 0; }}"
        )
        self.render()

    # Tab walks the messages' links (Copy, Edit, Regenerate, ‹ 1/2 ›, …) as QTextBrowser does, the focused
    # one highlighted, Enter follows it; after the last one Tab goes on to the next control. Shift+Tab from
    # the message box reaches the latest message's links first.

    def add_message_part(self, render) -> None:
        """`render(row, message, streaming) -> str`: HTML added to each message after its text and tool
        calls ("" for none), e.g. card_html() cards. Re-run on every render: keep it cheap."""
        self._parts.append(render)
        self.schedule()

    def add_link_handler(self, action: str, handler) -> None:
        """Links `action:ARG` in the transcript call `handler(ARG)` (a part's own links: allow, deny, …)."""
        self._link_handlers[action] = handler

    def set_empty_hint(self, text: str) -> None:
        self.empty_hint = text
        self.schedule()

    def _on_reset(self) -> None:
        self._follow = True  # a conversation was opened: show its latest messages
        self._update_jump()
        self.schedule()

    def _on_user_scrolled(self, *_args) -> None:
        bar = self.verticalScrollBar()
        self._follow = bar.sliderPosition() >= bar.maximum() - NEAR_BOTTOM_PX
        self._update_jump()

    def _on_range(self, _min: int, maximum: int) -> None:
        if self._follow:
            self.verticalScrollBar().setValue(maximum)

    def jump_to_latest(self) -> None:
        """Scroll to the end of the transcript and follow new text again."""
        self._follow = True
        # As in render: the cursor at the end keeps Qt showing the end while it lays the text out lazily.
        self.moveCursor(QTextCursor.MoveOperation.End)
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())
        self._update_jump()

    def _update_jump(self, *_args) -> None:
        bar = self.verticalScrollBar()
        away = not self._follow and bar.value() < bar.maximum() - NEAR_BOTTOM_PX
        if away:
            self._place_jump()
            self.jump_button.raise_()
        self.jump_button.setVisible(away)

    def _place_jump(self) -> None:
        b, vp = self.jump_button, self.viewport().geometry()
        b.adjustSize()
        b.move(vp.x() + (vp.width() - b.width()) // 2, vp.bottom() - b.height() - 12)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._place_jump()
        self._update_jump()

    def schedule(self, *_args) -> None:
        if not self._timer.isActive():
            self._timer.start()

    def _message_html(self, row: int) -> str:
        msg = self.model.message(row)
        if msg.role == "tool":  # an MCP tool call and its result (mcp_cards)
            return tool_card_html(row, msg, msg.id in self.open_cards)
        streaming = row == self.model.streaming_row
        key = (msg.id, row, msg.content)
        body = None if streaming else self._cache.get(key)
        if body is None:
            pretty = json_reply(msg.content) if msg.role == "assistant" and not streaming else None
            if pretty is not None:  # structured output: shown as formatted JSON
                body = render_markdown(f"```json\n{pretty}\n```", f"copycode:{row}:")
            elif msg.role == "assistant":
                body = render_markdown(msg.content, f"copycode:{row}:")
            else:
                body = "<p>" + html.escape(msg.content).replace("\n", "<br>") + "</p>"
            if not streaming:
                self._cache[key] = body
        if streaming:
            body += f'<span style="color:{theme.ACCENT};">▍</span>' if msg.content else (
                f'<p style="color:{theme.MUTED};">Thinking…</p>')
        body = self._thought_html(row, msg, streaming) + body + self._tools_html(row, msg)
        body += "".join(part(row, msg, streaming) or "" for part in self._parts)
        if msg.role == "assistant" and msg.stats.get("sources"):
            body += sources_html(row, msg.stats["sources"], {i for m, i in self.open_sources if m == msg.id})
        who = "You" if msg.role == "user" else "Assistant"
        bg = "#1a2130" if msg.role == "user" else theme.BG
        parts = [
            f'<table width="100%" cellspacing="0" cellpadding="12" style="background-color:{bg}; margin-bottom:6px;">'
            f'<tr><td><p style="color:{theme.MUTED}; font-weight:600; margin-bottom:4px;">{who}</p>{body}'
        ]
        if msg.error:
            parts.append(
                f'<table width="100%" cellpadding="10" style="background-color:#2a1517; margin-top:6px;"><tr><td>'
                f'<span style="color:{theme.ERROR}; font-weight:600;">Error</span>&nbsp; '
                f'<span style="color:#f0c4c1;">{html.escape(msg.error)}</span><br>'
                f'{self._branch_links(row, msg)}'
                f'<a href="regen:{row}" style="color:{theme.ACCENT};">Retry</a> &nbsp;·&nbsp; '
                f'<a href="delete:{row}">Delete</a></td></tr></table>'
            )
        if msg.role == "assistant" and not streaming and not msg.error:
            footer = stats_line(msg.stats)
            links = (f'<a href="copy:{row}">Copy</a> &nbsp;·&nbsp; <a href="regen:{row}">Regenerate</a>'
                     f' &nbsp;·&nbsp; <a href="delete:{row}">Delete</a>')
            if msg.content and row == self.model.rowCount() - 1 and is_cut_short(msg.stats):
                links = f'<a href="continue:{row}" style="color:{theme.ACCENT};">Continue</a> &nbsp;·&nbsp; ' + links
            links = self._branch_links(row, msg) + links
            parts.append(
                f'<p style="color:{theme.MUTED}; font-size:small; margin-top:6px;">'
                f'{html.escape(footer)}{" &nbsp;·&nbsp; " if footer else ""}{links}</p>'
            )
        elif msg.role == "user":
            # A question left without a reply (its reply deleted, or never written) can be answered.
            answer = (f' &nbsp;·&nbsp; <a href="regen:{row}" style="color:{theme.ACCENT};">Regenerate</a>'
                      if self.unanswered(row) else "")
            parts.append(f'<p style="font-size:small; margin-top:4px;">{self._branch_links(row, msg)}<a href="copy:{row}">Copy</a>'
                         f' &nbsp;·&nbsp; <a href="edit:{row}">Edit</a>{answer} &nbsp;·&nbsp; <a href="delete:{row}">Delete</a></p>')
        parts.append("</td></tr></table>")
        return "".join(parts)

    def unanswered(self, row: int) -> bool:
        """The user's message at `row` has no reply after it (the next message is not the assistant's)."""
        nxt = self.model.message(row + 1) if row + 1 < self.model.rowCount() else None
        return (nxt is None or nxt.role == "user") and self.model.streaming_row < 0

    @staticmethod
    def _branch_links(row: int, msg) -> str:
        """‹ 2/3 ›: the branches at this message (edits of it, regenerated replies), to flip between."""
        count = len(msg.siblings)
        if count < 2 or msg.id not in msg.siblings:
            return ""
        at = msg.siblings.index(msg.id)
        prev = f'<a href="ver:{row}:{at - 1}">‹</a>' if at > 0 else "‹"
        nxt = f'<a href="ver:{row}:{at + 1}">›</a>' if at < count - 1 else "›"
        return f"{prev} {at + 1}/{count} {nxt} &nbsp;·&nbsp; "

    def _thought_html(self, row: int, msg, streaming: bool) -> str:
        """The model's reasoning, folded: "▸ Thought for 4.2 s" (click to open)."""
        thought = msg.stats.get("reasoning") if msg.role == "assistant" else ""
        if not thought:
            return ""
        if streaming and not msg.content:
            head, open_ = "▾ Thinking…", True  # live while it thinks
        else:
            secs = msg.stats.get("reasoning_s")
            head = f"Thought for {secs:.1f} s" if secs is not None else "Thought"
            open_ = msg.id in self.open_thoughts
            head = ("▾ " if open_ else "▸ ") + head
        out = f'<p style="margin-bottom:4px;"><a href="think:{row}">{head}</a></p>'
        if open_:
            text = html.escape(thought.strip()).replace("\n", "<br>")
            out += (f'<table width="100%" cellpadding="8" style="background-color:#161a22; margin-bottom:6px;">'
                    f'<tr><td style="color:{theme.MUTED};">{text}</td></tr></table>')
        return out

    def _tools_html(self, row: int, msg) -> str:
        """Tool calls the model made: one folded line each (name and arguments), unfolded as JSON."""
        out = []
        for i, call in enumerate(msg.stats.get("tool_calls") or []):
            args = str(call.get("arguments") or "")
            short = " ".join(args.split())
            short = short if len(short) <= 60 else short[:59] + "…"
            open_ = (msg.id, i) in self.open_tools
            out.append(f'<p style="margin:4px 0;"><a href="tool:{row}:{i}">{"▾" if open_ else "▸"} 🔧 '
                       f'{html.escape(str(call.get("name") or "tool"))}({html.escape(short)})</a></p>')
            if open_:
                out.append(render_markdown(f"```json\n{pretty_arguments(args)}\n```", f"copycode:{row}:"))
        return "".join(out)

    def render(self) -> None:
        bar = self.verticalScrollBar()
        keep = bar.value()
        rows = self.model.rowCount()
        if not rows:
            self.setHtml(
                f'<br><br><br><br><br><br><p align="center" style="font-size:20pt; font-weight:600;">'
                f"What can I help with?</p><p align='center' style='color:{theme.MUTED};'>{html.escape(self.empty_hint)}</p>"
            )
            return
        self.setHtml("".join(self._message_html(r) for r in range(rows)))
        if self._follow:
            # Put the cursor at the end: Qt keeps the cursor in view as it (lazily) lays the text out.
            self.moveCursor(QTextCursor.MoveOperation.End)
            bar.setValue(bar.maximum())
        else:
            bar.setValue(keep)

    def _on_link(self, url: QUrl) -> None:
        if url.scheme() in ("http", "https"):
            QDesktopServices.openUrl(url)
            return
        action, _, arg = url.toString().partition(":")
        if action in self._link_handlers:
            self._link_handlers[action](arg)
            return
        if action == "copycode":
            row, _, idx = arg.partition(":")
            msg = self.model.message(int(row)) if row.isdigit() else None
            blocks = (card_blocks(msg) if msg.role == "tool" else code_blocks(msg.content)) if msg else []
            if idx.isdigit() and int(idx) < len(blocks):
                QGuiApplication.clipboard().setText(blocks[int(idx)])
                self.notice.emit("Code copied to the clipboard")
            return
        if action == "toolans":
            row_text, _, decision = arg.partition(":")
            if row_text.isdigit():
                self.tool_answer.emit(int(row_text), decision)
            return
        if action in ("think", "tool", "ver", "src", "toolcard"):
            self._fold_link(action, arg)
            return
        if action not in ("copy", "regen", "edit", "delete", "continue") or not arg.isdigit():
            return
        row = int(arg)
        msg = self.model.message(row)
        if msg is None:
            return
        if action == "copy":
            QGuiApplication.clipboard().setText(msg.content)
            self.notice.emit("Message copied to the clipboard")
        elif action == "delete":
            self.delete_requested.emit(row)
        elif action == "edit":
            self.edit_requested.emit(row)
        elif action == "continue":
            self.continue_requested.emit(row)
        else:
            self.regenerate_requested.emit(row)

    def _fold_link(self, action: str, arg: str) -> None:
        row_text, _, sub = arg.partition(":")
        msg = self.model.message(int(row_text)) if row_text.isdigit() else None
        if msg is None:
            return
        if action == "think":
            self.open_thoughts ^= {msg.id}
        elif action == "tool" and sub.isdigit():
            self.open_tools ^= {(msg.id, int(sub))}
        elif action == "toolcard":
            self.open_cards ^= {msg.id}
        elif action == "src" and sub.isdigit():
            self.open_sources ^= {(msg.id, int(sub))}
        elif action == "ver" and sub.lstrip("-").isdigit():
            self.branch_requested.emit(int(row_text), int(sub))
            return
        self.render()
