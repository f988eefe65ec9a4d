"""The chat's logic: current conversation, sending, streaming into the message model, stop, regenerate.

Holds no widgets; the chat panel is a view over it."""

from __future__ import annotations

import logging
import time

from PySide6.QtCore import QObject, Signal, Slot

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.chat_errors import normalize_base_url
from wslm.gui.chat_model import ConversationListModel, MessageListModel
from wslm.gui.chat_store import ChatStore, Conversation
from wslm.gui.stream_worker import ChatRequest, StreamWorker

log = logging.getLogger(__name__)

TITLE_CHARS = 48
SAVE_EVERY_S = 0.5  # how often a streaming reply is written to SQLite (not per token)


def title_from(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "…"


class ChatSession(QObject):
    busy_changed = Signal(bool)
    reply_finished = Signal(dict)  # stats of the last reply (tokens/s for the status bar)
    reply_failed = Signal(str, str)  # kind, message
    first_token = Signal(float)
    current_changed = Signal(int)  # conversation id (0: none)

    def __init__(self, store: ChatStore, defaults: dict | None = None, parent=None) -> None:
        super().__init__(parent)
        self.store = store
        self.conversations = ConversationListModel(store, self)
        self.messages = MessageListModel(store, self)
        self.defaults = defaults or {}  # system_prompt, temperature, top_p, max_tokens for new chats
        self.base_url = ""
        self.api_key = ""
        self.model = ""
        self._worker: StreamWorker | None = None
        self._retired: list[StreamWorker] = []  # stopped workers still closing their connection
        self._saved_at = 0.0  # when the streaming reply was last written to the store

    # Endpoint
    def set_endpoint(self, base_url: str, api_key: str = "", model: str | None = None) -> None:
        self.base_url = normalize_base_url(base_url)
        self.api_key = api_key
        if model is not None:
            self.model = model

    # Conversations
    @property
    def busy(self) -> bool:
        return self._worker is not None

    def current(self) -> Conversation | None:
        cid = self.messages.conversation_id
        return self.store.get_conversation(cid) if cid else None

    def open(self, conv_id: int) -> None:
        if conv_id == self.messages.conversation_id:
            return
        self.stop()
        self.messages.load(conv_id)
        self.current_changed.emit(conv_id)

    def new_conversation(self) -> Conversation:
        current = self.current()
        if current is not None and not self.messages.rowCount():
            return current  # an empty chat is already open: no second empty one
        self.stop()
        params = {k: v for k, v in self.defaults.items() if k in ("system_prompt", "temperature", "top_p", "max_tokens")}
        conv = self.conversations.create(**params)
        self.messages.load(conv.id)
        self.current_changed.emit(conv.id)
        return conv

    def delete_conversation(self, row: int) -> None:
        conv = self.conversations.conversation(row)
        if conv is None:
            return
        if conv.id == self.messages.conversation_id:
            self.stop()
            self.messages.load(0)
            self.current_changed.emit(0)
        self.conversations.delete(row)

    def update_params(self, **changes) -> None:
        cid = self.messages.conversation_id
        if cid:
            self.store.update_conversation(cid, **changes)

    # Sending
    def send(self, text: str) -> bool:
        """Add the user's message and stream the reply; False (nothing changed) if busy or empty."""
        text = text.strip()
        if not text or self.busy:
            return False
        conv = self.current() or self.new_conversation()
        if not self.messages.rowCount():
            self.conversations.rename(self.conversations.row_of(conv.id), title_from(text))
        self.messages.append("user", text)
        self._start_reply()
        return True

    def regenerate(self, row: int | None = None) -> bool:
        """Replace the assistant reply at `row` (default: the last one) and everything after it."""
        if self.busy:
            return False
        items = self.messages.messages()
        if row is None:
            row = max((i for i, m in enumerate(items) if m.role == "assistant"), default=-1)
            if items and items[-1].role == "user":  # a failed send left only the question
                self._start_reply()
                return True
        if not (0 <= row < len(items)) or items[row].role != "assistant":
            return False
        self.messages.remove_from(row)
        self._start_reply()
        return True

    def stop(self) -> None:
        """End the stream now: the reply so far is kept, the connection closes, the server aborts."""
        worker = self._worker
        if worker is None:
            return
        self._detach(worker)
        worker.stop()
        row = self.messages.streaming_row
        if row >= 0:
            self.messages.finish(row, {"stopped": True, "finish_reason": "stopped"})
        self.busy_changed.emit(False)

    def shutdown(self, wait_ms: int = 3000) -> None:
        self.stop()
        for worker in self._retired:
            worker.wait(wait_ms)

    def request_messages(self) -> list[dict]:
        conv = self.current()
        out = []
        if conv and conv.system_prompt.strip():
            out.append({"role": "system", "content": conv.system_prompt})
        for i, msg in enumerate(self.messages.messages()):
            if i == self.messages.streaming_row or msg.role not in ("user", "assistant"):
                continue
            if msg.role == "assistant" and (msg.error and not msg.content or not msg.content):
                continue
            out.append({"role": msg.role, "content": msg.content})
        return out

    def _start_reply(self) -> None:
        conv = self.current()
        row = self.messages.append("assistant", "")
        self.messages.streaming_row = row
        self.store.begin_reply(self.messages.message(row).id)
        self._saved_at = time.monotonic()
        request = ChatRequest(
            base_url=self.base_url,
            api_key=self.api_key,
            model=self.model or (conv.model if conv else "") or "default",
            messages=self.request_messages(),
            temperature=conv.temperature if conv else 0.7,
            top_p=conv.top_p if conv else 0.95,
            max_tokens=conv.max_tokens if conv else 1024,
        )
        worker = StreamWorker(request, self)
        worker.delta.connect(self._on_delta)
        worker.first_token.connect(self.first_token)
        worker.done.connect(self._on_done)
        worker.failed.connect(self._on_failed)
        # A bound slot, not a lambda: QThread.finished is emitted on the worker thread, and only a
        # receiver living on the GUI thread makes the call queued (deleting the QThread object from
        # its own, still-running thread crashes).
        worker.finished.connect(self._on_worker_finished)
        self._worker = worker
        self.busy_changed.emit(True)
        worker.start()

    def _detach(self, worker: StreamWorker) -> None:
        for sig, slot in ((worker.delta, self._on_delta), (worker.done, self._on_done),
                          (worker.failed, self._on_failed), (worker.first_token, self.first_token)):
            try:
                sig.disconnect(slot)
            except (RuntimeError, TypeError):
                pass
        self._worker = None
        self._retired.append(worker)

    @Slot()
    def _on_worker_finished(self) -> None:
        worker = self.sender()
        if isinstance(worker, StreamWorker) and worker in self._retired:
            self._retired.remove(worker)
            worker.wait()  # returns at once: run() is over, let the thread finish exiting
            worker.deleteLater()

    def _on_delta(self, text: str) -> None:
        row = self.messages.streaming_row
        if row >= 0:
            self.messages.append_text(row, text)
            now = time.monotonic()
            if now - self._saved_at >= SAVE_EVERY_S:  # the reply so far survives the app being killed
                self._saved_at = now
                msg = self.messages.message(row)
                self.store.save_partial(msg.id, msg.content)

    def _on_done(self, stats: dict) -> None:
        worker = self._worker
        row = self.messages.streaming_row
        if row >= 0:
            self.messages.finish(row, stats)
        if worker:
            self._detach(worker)
        self.conversations.touch(self.messages.conversation_id)
        self.busy_changed.emit(False)
        self.reply_finished.emit(stats)

    def _on_failed(self, kind: str, message: str) -> None:
        worker = self._worker
        row = self.messages.streaming_row
        if row >= 0:
            self.messages.finish(row, {"error_kind": kind}, error=message)
        if worker:
            self._detach(worker)
        self.busy_changed.emit(False)
        self.reply_failed.emit(kind, message)
