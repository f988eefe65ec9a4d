"""ChatPanel's sending: Send (also with an empty box, for a question left without a reply), Stop,
Regenerate, and the requests that wait for our server (the note under the transcript offers to start it).

A mixin of ChatPanel: it uses the panel's session, settings, composer and signals."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.link_label import LinkLabel


class ChatSending:
    def _init_notes(self, lay: QVBoxLayout) -> None:
        """The note lines: a model switch's progress and the chat's own model (above the transcript), and
        problems or progress (below it, above the message box)."""
        self.server_state = "stopped"  # our server's state (set by the main window)
        self.server_coming = False  # our server is starting, loading or restarting: it will be ready
        # A request waiting for our server to be ready: (conversation id, row to regenerate or None for
        # "answer the last message"). One at a time: the chat is one conversation with one server.
        self.pending: tuple[int, int | None] | None = None
        self._offered: tuple[int, int | None] | None = None  # what "start it" in the note will then ask
        self._server_note = False  # the note under the transcript is about the server (cleared when ready)
        self.switch_note = QLabel(objectName="Muted")  # a model switch's progress (the header has no room)
        self.model_hint = QLabel(objectName="Muted")  # a chat that talked to another model offers it back
        self.error_label = LinkLabel(objectName="Muted")
        self.error_label.linkActivated.connect(self._on_note_link)
        self.model_hint.linkActivated.connect(lambda model_id: self.choose_model(model_id))
        for label in (self.switch_note, self.model_hint, self.error_label):
            label.setWordWrap(True)
            label.hide()
            lay.addWidget(label)
        # Its link ("start it") is reached with Tab, and Enter follows it: a Tab stop while it is shown with a
        # link (_show_error), placed in the Tab order by the panel.
        self.error_label.setFocusPolicy(Qt.FocusPolicy.TabFocus)

    # For other parts (documents, tools): the line under the transcript.
    def show_problem(self, text: str) -> None:
        """Say what went wrong and what to do, under the transcript (plain text; until the next note)."""
        self._show_error(text)

    def clear_note(self) -> None:
        """The line under the transcript goes (its cause is gone)."""
        self.error_label.hide()
        self._server_note = False

    def _show_error(self, text: str, server: bool = False, rich: bool = False) -> None:
        """`server`: a note about our server's availability (it goes when the server is ready). `rich`: the
        text is HTML (a link to act on); otherwise it is escaped."""
        self.error_label.setText(f"<span style='color:#f85149;'>⚠</span> {text if rich else html.escape(text, quote=False)}")
        # A note with a link ("start it") is a Tab stop: Tab reaches the link, Enter follows it.
        self.error_label.setFocusPolicy(Qt.FocusPolicy.TabFocus if rich and "<a " in text else Qt.FocusPolicy.NoFocus)
        self.error_label.show()
        self._server_note = server

    def _show_note(self, text: str) -> None:
        """Progress, not a problem: waiting for the server."""
        self.error_label.setText(f"<span style='color:#d29922;'>●</span> {html.escape(text, quote=False)}")
        self.error_label.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.error_label.show()
        self._server_note = True

    def unanswered_row(self) -> int:
        """The row of the open chat's last message when it is the user's (a question left without a reply:
        its reply deleted or never written), else -1."""
        row = self.session.messages.rowCount() - 1
        msg = self.session.messages.message(row)
        return row if msg is not None and msg.role == "user" and row != self.session.messages.streaming_row else -1

    # Sending
    def send(self) -> None:
        text = self.input.toPlainText()
        images = self.image_draft.images()  # the composer's images go with the text (content parts)
        if self.session.busy:
            return
        if self.image_draft.busy():
            self._show_error("Still reading an image: send when its thumbnail shows (your text is kept).")
            return
        if not text.strip() and not images:
            if self.editing_row < 0 and self.unanswered_row() >= 0:
                self._regenerate(self.unanswered_row())  # Send with an empty box answers the last question
            return
        if self.switching_to and self.settings.chat_use_server:
            self._show_error("The new model is still loading: send when it is ready (your text is kept).",
                             server=True)
            return
        if not self.session.base_url:
            self._no_server(None if self.editing_row >= 0 else text)
            return
        reading = self.attachments.busy()
        if reading:  # its passages are not stored yet: the message would go without them
            self._show_error(f"Still reading {', '.join(reading)}: send when it is attached (your text is kept).")
            return
        if self.editing_row >= 0:
            if self.session.edit_and_rerun(self.editing_row, text, images):
                self.input.clear()
                self.image_draft.clear()
                self.cancel_edit()
            self.input.setFocus()
            return
        if self.session.send(text, images):
            self.input.clear()
            self.image_draft.clear()
            self.title.setText(self.session.current().title)
            self.error_label.hide()
        self.input.setFocus()

    def stop(self) -> None:
        self.session.stop()
        self.input.setFocus()

    def _regenerate(self, row: int) -> None:
        """Regenerate (Retry) the reply at `row`, or answer the user's message at `row` left without one."""
        if not self.session.base_url and not self.session.busy:  # Retry with the server gone
            self._no_server(None, regen_row=row)
            return
        if self.session.regenerate(row):
            self.error_label.hide()

    # Waiting for our server
    def _no_server(self, text: str | None, regen_row: int | None = None) -> None:
        """Send (text) or Retry (regen_row) with nowhere to send to: while our server loads, the request
        waits for it; when it is not running, say so and offer to start it. The text is never dropped."""
        conv_id = self.session.messages.conversation_id
        if not self.settings.chat_use_server:
            self._show_error("No URL to send to: set one under Connection (⚙), or switch to the wslm server.")
            return
        if self.server_coming:
            if regen_row is not None:
                self._wait_for_server(conv_id, regen_row)
            elif text is not None:
                self._queue_send(text)
            else:  # editing a sent message: the edit is kept in the box until the server is ready
                self._show_error("The server is still loading: send when it is ready (your text is kept).",
                                 server=True)
            return
        self._offered = (conv_id, regen_row) if regen_row is not None else None
        then = (" and the reply is retried once it is ready" if regen_row is not None
                else " and your message is sent once it is ready" if text is not None else "")
        self._show_error(f"The server is not running: <a href='start'>start it</a>{then} (or use the Server "
                         "panel), or set a URL under Connection. Your text is kept.", server=True, rich=True)

    def _queue_send(self, text: str) -> None:
        if self.pending is not None:
            self._show_error("A message is already waiting for the server: send this one when it is ready "
                             "(your text is kept).", server=True)
            return
        if self.session.queue(text, self.image_draft.images()):
            self.input.clear()
            self.image_draft.clear()
            self.title.setText(self.session.current().title)
            self._wait_for_server(self.session.messages.conversation_id, None)

    def _wait_for_server(self, conv_id: int, row: int | None) -> None:
        self.pending = (conv_id, row)
        what = "your message is sent" if row is None else "the reply is retried"
        self._show_note(f"The server is getting ready: {what} as soon as it is.")

    def _on_note_link(self, link: str) -> None:
        if link == "start":
            self.start_server()

    def start_server(self) -> None:
        """Take the offer: start our server, and send what was waiting (the typed text, a retry) when ready."""
        offered, self._offered = self._offered, None
        self.start_server_requested.emit()
        if not self.server_coming:
            self._show_error("The server did not start: the Server panel says why.", server=True)
            return
        text = self.input.toPlainText()
        if offered is not None:
            self._wait_for_server(*offered)
        elif (text.strip() or self.image_draft.images()) and self.editing_row < 0:
            self._queue_send(text)
        else:
            self._show_note("Starting the server…")

    def set_server_state(self, state: str, coming: bool, detail: str = "") -> None:
        """Our server's state; `coming`: it is on its way to ready (starting, loading, restarting)."""
        changed = (state, coming) != (self.server_state, self.server_coming)
        self.server_state, self.server_coming = state, coming
        if changed and self.settings.chat_use_server and not self.server_url:
            self._apply_connection()  # the header chip says "loading…", as the title bar and banner do
        if coming or state == "ready" or self.pending is None:
            return
        # It stopped before it was ready: the waiting message stays in the chat, and can go out later.
        self._offered, self.pending = self.pending, None
        why = f" ({detail})" if detail and state == "crashed" else ""
        self._show_error(f"The server stopped before it was ready{html.escape(why)}: <a href='start'>start it "
                         "again</a> to send what was waiting (or use the Server panel).", server=True, rich=True)

    def _server_ready(self) -> None:
        """Our server is ready: the stale "not running" note goes, and what waited for it is sent."""
        if self._server_note:
            self.error_label.hide()
            self._server_note = False
        pending, self.pending = self.pending, None
        self._offered = None
        if pending is None:
            return
        conv_id, row = pending
        if self.session.store.get_conversation(conv_id) is None:
            return  # deleted meanwhile
        self.session.open(conv_id)  # where the message was written (the user may have looked at another chat)
        if row is None:
            self.session.reply_to_last()
        else:
            self.session.regenerate(row)
