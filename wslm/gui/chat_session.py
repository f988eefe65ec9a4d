"""The chat's logic: current conversation, sending, streaming into the message model, stop, regenerate.

Holds no widgets; the chat panel is a view over it."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Signal, Slot

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.chat_errors import normalize_base_url
from wslm.gui.chat_model import ConversationListModel, MessageListModel
from wslm.gui.chat_store import ChatStore, Conversation, Message
from wslm.gui.context_fit import (
    DEFAULT_POLICY,
    LENIENT_BYTES_PER_TOKEN,
    STOP,
    Fit,
    context_from_error,
    fit_messages,
)
from wslm.gui.stream_worker import ChatRequest, StreamWorker

log = logging.getLogger(__name__)

TITLE_CHARS = 48
SAVE_EVERY_S = 0.5  # how often a streaming reply is written to SQLite (not per token)


def title_from(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "…"


def versions_of(msg: Message) -> list[dict]:
    """A reply's versions so far (itself included), for the regenerated one to extend."""
    if msg.stats.get("versions"):
        return list(msg.stats["versions"])
    own = {k: v for k, v in msg.stats.items() if k not in ("versions", "version")}
    return [{"content": msg.content, "stats": own}]


@dataclass
class _Reply:
    """One reply being streamed. It keeps streaming when the user opens another chat: the text grows in
    `message` (the very object the message model shows while its chat is open) and is saved at the end."""

    conv_id: int
    message: Message
    worker: StreamWorker
    started: float = field(default_factory=time.monotonic)
    ttft_s: float | None = None
    chunks: int = 0
    saved_at: float = field(default_factory=time.monotonic)  # when the text so far was last written to the store
    versions: list[dict] = field(default_factory=list)  # earlier replies this one regenerates (kept as ‹ 1/2 ›)
    think_start: float | None = None
    think_end: float | None = None
    context_note: str = ""  # what was left out of the prompt to fit the context (shown under the reply)

    def final_stats(self, stats: dict) -> dict:
        """The reply's stats plus what the chat keeps with it: the reasoning and the earlier versions."""
        out = dict(stats)
        if self.context_note:
            out["context_note"] = self.context_note
        thought = self.message.stats.get("reasoning", "")
        if thought:
            end = self.think_end or time.monotonic()
            out["reasoning"] = thought
            out["reasoning_s"] = round(end - (self.think_start or end), 1)
        if self.versions:
            own = {k: v for k, v in out.items() if k not in ("versions", "version")}
            out["versions"] = [*self.versions, {"content": self.message.content, "stats": own}]
            out["version"] = len(out["versions"]) - 1
        return out

    def partial_stats(self, interrupted: str = "") -> dict:
        """Stats of a reply stopped early: what was measured up to the stop. `interrupted`: why, when it was
        not the user's Stop (shown under the reply)."""
        gen = time.monotonic() - self.started - (self.ttft_s or 0.0)
        return {"ttft_s": round(self.ttft_s, 3) if self.ttft_s is not None else None, "tokens": self.chunks,
                "tokens_per_s": round(self.chunks / gen, 1) if gen > 0 and self.chunks > 1 else None,
                "stopped": True, "finish_reason": "stopped", **({"interrupted": interrupted} if interrupted else {})}


class ChatSession(QObject):
    busy_changed = Signal(bool)  # the *open* chat started or ended a reply
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
        self.context_len: int | None = None  # the served model's max_model_len, when our server says it
        self.overflow_policy = DEFAULT_POLICY  # what a conversation longer than the context sends (context_fit)
        # Per (URL, model): the context a server named when it refused a prompt as too long, and whether the
        # lenient token estimate proved too low there (then the strict bound is used).
        self._learned_context: dict[tuple[str, str], int] = {}
        self._strict: set[tuple[str, str]] = set()
        self._replies: dict[int, _Reply] = {}  # conversation id -> its streaming reply
        self._retired: list[StreamWorker] = []  # stopped workers still closing their connection

    # Endpoint
    def set_endpoint(self, base_url: str, api_key: str = "", model: str | None = None,
                     context_len: int | None = None) -> None:
        """context_len: the served model's max_model_len (our server's ready event), None when unknown."""
        self.base_url = normalize_base_url(base_url)
        self.api_key = api_key
        self.context_len = context_len
        if model is not None:
            self.model = model

    def fitting_max_tokens(self, max_tokens: int, messages: list[dict]) -> int | None:
        """The chat's max tokens, or None (up to the context's end, counted by the server) when it might not
        fit beside the prompt: after a switch to a model with a shorter context a reply must still come,
        not a "conversation is too long" error. Bytes bound the prompt's tokens from above (a BPE token is
        one byte or more), plus room for the chat template's markers."""
        context_len = self.effective_context()
        if not context_len:
            return max_tokens
        prompt_bound = sum(len(str(m.get("content") or "").encode()) + 8 for m in messages) + 32
        return max_tokens if max_tokens + prompt_bound <= context_len else None

    def effective_context(self) -> int | None:
        """The context window replies must fit: our server's max_model_len, else what the server said."""
        return self.context_len or self._learned_context.get((self.base_url, self.model))

    def fit_request(self, messages: list[dict], max_tokens: int) -> Fit:
        """`messages` made to fit the context window, as the overflow policy says."""
        strict = (self.base_url, self.model) in self._strict
        return fit_messages(messages, self.effective_context(), max_tokens, self.overflow_policy,
                            bytes_per_token=1.0 if strict else LENIENT_BYTES_PER_TOKEN)

    # Conversations
    @property
    def busy(self) -> bool:
        """The open chat is streaming a reply (other chats may be too: see streaming_ids)."""
        return self.messages.conversation_id in self._replies

    @property
    def _worker(self) -> StreamWorker | None:
        """The open chat's stream worker (None when it is not streaming)."""
        reply = self._replies.get(self.messages.conversation_id)
        return reply.worker if reply else None

    @property
    def streaming_ids(self) -> set[int]:
        return set(self._replies)

    def current(self) -> Conversation | None:
        cid = self.messages.conversation_id
        return self.store.get_conversation(cid) if cid else None

    def open(self, conv_id: int) -> None:
        """Show another chat; a reply streaming in the one left keeps going in the background."""
        if conv_id == self.messages.conversation_id:
            return
        self._load(conv_id)

    def _load(self, conv_id: int) -> None:
        self.messages.load(conv_id)
        reply = self._replies.get(conv_id)
        if reply is not None:
            self.messages.attach_stream(reply.message)
        self.current_changed.emit(conv_id)
        self.busy_changed.emit(self.busy)

    def new_conversation(self) -> Conversation:
        current = self.current()
        if current is not None and not self.messages.rowCount():
            return current  # an empty chat is already open: no second empty one
        params = {k: v for k, v in self.defaults.items() if k in ("system_prompt", "temperature", "top_p", "max_tokens")}
        conv = self.conversations.create(**params)
        self._load(conv.id)
        return conv

    def delete_conversation(self, row: int) -> None:
        conv = self.conversations.conversation(row)
        if conv is None:
            return
        self.stop(conv.id)
        if conv.id == self.messages.conversation_id:
            self._load(0)
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

    def queue(self, text: str) -> bool:
        """Add the user's message without asking yet (the server is still loading); reply_to_last() asks
        once it is ready. The text is saved with the chat meanwhile, so nothing is lost if it never is."""
        text = text.strip()
        if not text or self.busy:
            return False
        conv = self.current() or self.new_conversation()
        if not self.messages.rowCount():
            self.conversations.rename(self.conversations.row_of(conv.id), title_from(text))
        self.messages.append("user", text)
        return True

    def reply_to_last(self) -> bool:
        """Ask for the reply to the open chat's last message, when that is the user's (a queued send)."""
        last = self.messages.message(self.messages.rowCount() - 1)
        if self.busy or last is None or last.role != "user":
            return False
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
        old = items[row]
        versions = versions_of(old) if old.content else []
        self.messages.remove_from(row)
        self._start_reply(versions)
        return True

    def show_version(self, row: int, index: int) -> bool:
        """Flip a regenerated reply to another of its versions (‹ 2/3 ›); the one shown is what the
        conversation continues from."""
        msg = self.messages.message(row)
        versions = (msg.stats.get("versions") or []) if msg else []
        if not (0 <= index < len(versions)) or row == self.messages.streaming_row:
            return False
        chosen = versions[index]
        msg.content = chosen["content"]
        self.messages.finish(row, {**chosen.get("stats", {}), "versions": versions, "version": index},
                             error=msg.error)
        return True

    def delete_message(self, row: int) -> bool:
        """Delete one message from the open chat (view and store): a message too long for the context, a
        failed reply. Not while the chat is streaming (rows would shift under the reply)."""
        if self.busy or self.messages.message(row) is None:
            return False
        self.messages.remove_row(row)
        return True

    def edit_and_rerun(self, row: int, text: str) -> bool:
        """Replace the user's message at `row` with `text`, drop everything after it, and ask again."""
        text = text.strip()
        msg = self.messages.message(row)
        if self.busy or not text or msg is None or msg.role != "user":
            return False
        self.messages.remove_from(row)
        self.messages.append("user", text)
        self._start_reply()
        return True

    def stop(self, conv_id: int | None = None, interrupted: str = "") -> None:
        """End the open chat's stream (or `conv_id`'s) now: the reply so far is kept with the stats
        measured until then, the connection closes, the server aborts. `interrupted`: why, when it was not
        the user's own Stop."""
        reply = self._replies.get(self.messages.conversation_id if conv_id is None else conv_id)
        if reply is None:
            return
        reply.worker.stop()
        self._finish(reply, reply.partial_stats(interrupted))

    def interrupt(self, reason: str) -> int:
        """End every streaming reply, keeping its text, marked "interrupted: <reason>" (the server is going
        away: a model switch, a restart). Returns how many there were."""
        ids = list(self._replies)
        for conv_id in ids:
            self.stop(conv_id, interrupted=reason)
        return len(ids)

    def shutdown(self, wait_ms: int = 3000) -> None:
        for conv_id in list(self._replies):
            self.stop(conv_id)
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

    def _start_reply(self, versions: list[dict] | None = None) -> None:
        conv = self.current()
        row = self.messages.append("assistant", "")
        self.messages.streaming_row = row
        max_tokens = conv.max_tokens if conv else 1024
        fit = self.fit_request(self.request_messages(), max_tokens)
        if fit.messages is None:  # policy "stop" (or nothing fits): said in place of the reply, nothing sent
            self.messages.finish(row, {"error_kind": "context"}, error=fit.note)
            self.reply_failed.emit("context", fit.note)
            return
        messages = fit.messages
        request = ChatRequest(
            base_url=self.base_url,
            api_key=self.api_key,
            model=self.model or (conv.model if conv else "") or "default",
            messages=messages,
            temperature=conv.temperature if conv else 0.7,
            top_p=conv.top_p if conv else 0.95,
            max_tokens=self.fitting_max_tokens(max_tokens, messages),
        )
        worker = StreamWorker(request, self)
        worker.fit_key = (self.base_url, self.model)  # where a "too long" answer teaches the context's size
        worker.fit_context = self.effective_context()
        reply = _Reply(self.messages.conversation_id, self.messages.message(row), worker, versions=versions or [],
                       context_note=fit.note)
        if conv is not None and request.model != conv.model:
            self.store.update_conversation(conv.id, model=request.model)  # the chat remembers its model
        self.store.begin_reply(reply.message.id)
        worker.reply = reply
        worker.delta.connect(self._on_delta)
        worker.reasoning.connect(self._on_reasoning)
        worker.first_token.connect(self._on_first_token)
        worker.done.connect(self._on_done)
        worker.failed.connect(self._on_failed)
        # A bound slot, not a lambda: QThread.finished is emitted on the worker thread, and only a
        # receiver living on the GUI thread makes the call queued (deleting the QThread object from
        # its own, still-running thread crashes).
        worker.finished.connect(self._on_worker_finished)
        self._replies[reply.conv_id] = reply
        self.conversations.set_busy(reply.conv_id, True)
        self.busy_changed.emit(True)
        worker.start()

    def _reply_of_sender(self) -> _Reply | None:
        sender = self.sender()
        # Called directly (not by a worker's signal): the open chat's reply.
        reply = getattr(sender, "reply", None) if sender is not None else self._replies.get(self.messages.conversation_id)
        return reply if reply is not None and self._replies.get(reply.conv_id) is reply else None

    def _shown(self, reply: _Reply) -> bool:
        return reply.conv_id == self.messages.conversation_id and self.messages.streaming_row >= 0

    def _finish(self, reply: _Reply, stats: dict, error: str = "") -> None:
        """The reply ended (done, failed or stopped): save it, free its chat, retire its worker."""
        del self._replies[reply.conv_id]
        worker = reply.worker
        for sig, slot in ((worker.delta, self._on_delta), (worker.reasoning, self._on_reasoning), (worker.done, self._on_done),
                          (worker.failed, self._on_failed), (worker.first_token, self._on_first_token)):
            try:
                sig.disconnect(slot)
            except (RuntimeError, TypeError):
                pass
        self._retired.append(worker)
        stats = reply.final_stats(stats)
        if self._shown(reply):
            self.messages.finish(self.messages.streaming_row, stats, error=error)
        else:  # finished in the background: straight to SQLite, shown when its chat is opened
            reply.message.stats, reply.message.error = stats, error
            self.store.update_message(reply.message.id, content=reply.message.content, stats=stats, error=error)
        self.conversations.set_busy(reply.conv_id, False)
        if reply.conv_id == self.messages.conversation_id:
            self.busy_changed.emit(False)

    @Slot()
    def _on_worker_finished(self) -> None:
        worker = self.sender()
        if isinstance(worker, StreamWorker) and worker in self._retired:
            self._retired.remove(worker)
            worker.wait()  # returns at once: run() is over, let the thread finish exiting
            worker.deleteLater()

    def _on_first_token(self, seconds: float) -> None:
        reply = self._reply_of_sender()
        if reply is not None:
            reply.ttft_s = seconds
            if reply.conv_id == self.messages.conversation_id:
                self.first_token.emit(seconds)

    def _on_delta(self, text: str) -> None:
        reply = self._reply_of_sender()
        if reply is None:
            return
        reply.chunks += 1
        if reply.think_start is not None and reply.think_end is None:
            reply.think_end = time.monotonic()
        if self._shown(reply):
            self.messages.append_text(self.messages.streaming_row, text)
        else:
            reply.message.content += text
        now = time.monotonic()
        if now - reply.saved_at >= SAVE_EVERY_S:  # the reply so far survives the app being killed
            reply.saved_at = now
            self.store.save_partial(reply.message.id, reply.message.content)

    def _on_reasoning(self, text: str) -> None:
        """The model's thinking: kept apart from the answer (shown folded, stored, never sent back)."""
        reply = self._reply_of_sender()
        if reply is None:
            return
        reply.chunks += 1
        if reply.think_start is None:
            reply.think_start = time.monotonic()
        stats = reply.message.stats
        stats["reasoning"] = stats.get("reasoning", "") + text
        if self._shown(reply):
            self.messages.touch_row(self.messages.streaming_row)

    def _on_done(self, stats: dict) -> None:
        reply = self._reply_of_sender()
        if reply is None:
            return
        self._finish(reply, stats)
        self.conversations.touch(reply.conv_id)
        if reply.conv_id == self.messages.conversation_id:
            self.reply_finished.emit(stats)

    def _on_failed(self, kind: str, message: str) -> None:
        reply = self._reply_of_sender()
        if reply is None:
            return
        if kind == "context":
            message = self._learn_context(reply.worker, message)
        self._finish(reply, {"error_kind": kind}, error=message)
        if reply.conv_id == self.messages.conversation_id:
            self.reply_failed.emit(kind, message)

    def _learn_context(self, worker: StreamWorker, message: str) -> str:
        """The server refused the prompt as too long: remember its context size (and, when the prompt had been
        fitted already, that the token estimate fell short there), so the next send or a Retry fits."""
        key = getattr(worker, "fit_key", None)
        if key is None:
            return message
        fitted = getattr(worker, "fit_context", None)
        if fitted:
            self._strict.add(key)
        learned = context_from_error(message)
        if learned:
            self._learned_context[key] = learned
        if (learned or fitted) and self.overflow_policy != STOP:
            message += " Retry fits it to the context (“When the chat is too long” in the chat settings)."
        return message
