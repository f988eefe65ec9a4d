"""The chat's logic: current conversation, sending, streaming into the message model, stop, regenerate and
edit (as branches), continue a cut reply, the request's sampling, the context meter.

Holds no widgets; the chat panel is a view over it."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Signal, Slot

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.chat_errors import normalize_base_url
from wslm.gui.chat_model import ConversationListModel, MessageListModel
from wslm.gui.chat_store import SAMPLING, ChatStore, Conversation, Message, is_cut_short
from wslm.gui.content_parts import content_bytes, explain_refusal, message_content
from wslm.gui.context_fit import (
    DEFAULT_POLICY,
    LENIENT_BYTES_PER_TOKEN,
    STOP,
    TYPICAL_BYTES_PER_TOKEN,
    Fit,
    context_from_error,
    estimate_tokens,
    fit_messages,
)
from wslm.gui.stream_worker import ChatRequest, StreamWorker
from wslm.gui.tool_loop import NO_AUTO_NOTE, history_messages, tools_padding

log = logging.getLogger(__name__)

TITLE_CHARS = 48
SAVE_EVERY_S = 0.5  # how often a streaming reply is written to SQLite (not per token)


def title_from(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "…"


def sampling_extra(conv: Conversation | None) -> dict:
    """The optional sampling a chat set, as request fields; what it left unset is not sent (the server's
    default applies)."""
    if conv is None:
        return {}
    out = {k: getattr(conv, k) for k in ("top_k", "min_p", "repetition_penalty", "seed") if getattr(conv, k) is not None}
    if conv.stop:
        out["stop"] = list(conv.stop)
    if conv.json_mode:
        out["response_format"] = {"type": "json_object"}
    if conv.reasoning is not None:
        out["chat_template_kwargs"] = {"enable_thinking": conv.reasoning}
    return out


_ESCAPES = {"n": "\n", "t": "\t"}


def parse_stop(text: str) -> list[str]:
    """Stop strings typed in one line: comma-separated, with \\n, \\t and \\, for a newline, a tab, a comma."""
    out, cur, i = [], "", 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            cur += _ESCAPES.get(text[i + 1], text[i + 1])
            i += 2
            continue
        if c == ",":
            out.append(cur)
            cur = ""
        else:
            cur += c
        i += 1
    out.append(cur)
    return [t.strip(" ") for t in out if t.strip(" ")]


def format_stop(stops: list[str]) -> str:
    return ", ".join(t.replace("\\", "\\\\").replace(",", "\\,").replace("\n", "\\n").replace("\t", "\\t")
                     for t in stops)


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
    prior: dict | None = None  # a continued reply: its stats before Continue (the counts add up)
    prompt_estimate: int = 0  # the prompt's tokens as the context meter estimates them
    think_start: float | None = None
    think_end: float | None = None
    context_note: str = ""  # what was left out of the prompt to fit the context (shown under the reply)

    def final_stats(self, stats: dict) -> dict:
        """The reply's stats plus what the chat keeps with it: the reasoning (and, continued, the earlier part's)."""
        out = dict(stats)
        if self.context_note:
            out["context_note"] = self.context_note
        if out.get("prompt_tokens"):  # the server's count beside ours: the context meter corrects by the gap
            out["prompt_estimate"] = self.prompt_estimate
        thought = self.message.stats.get("reasoning", "")
        if thought:
            end = self.think_end or time.monotonic()
            out["reasoning"] = thought
            out["reasoning_s"] = round(end - (self.think_start or end), 1)
        if self.message.stats.get("sources"):  # the attached documents' passages it was given (cited under it)
            out["sources"] = self.message.stats["sources"]
        if self.prior is not None:
            if self.prior.get("tokens") and out.get("tokens") is not None:
                out["tokens"] = self.prior["tokens"] + out["tokens"]
            if self.think_start is None and "reasoning_s" in self.prior:
                out["reasoning_s"] = self.prior["reasoning_s"]
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
    # The developer view's history: a request's exact body as it went out, then how it ended (stats, error).
    request_sent = Signal(int, int, dict)  # conversation id, reply message id, body
    request_ended = Signal(int, int, dict, str)  # conversation id, reply message id, stats, error

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
        # The chat's attached documents (attachments.Attachments.plan): (chat id, messages, max tokens) -> a
        # plan the stream worker runs before sending, or None when the chat has none.
        self.documents = None
        # (chat id) -> about how many tokens its attached documents add to a request (the context meter).
        self.document_tokens = None
        # MCP tools offered to the model and the calls it makes (tool_loop.ToolLoop; mcp_chat.connect_chat
        # sets it), None: no tools.
        self.tool_loop = None
        # Whether a chat has attached documents (set by the chat panel): an empty chat with files attached is
        # not reused as a "New chat".
        self.has_documents = lambda conv_id: False

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
        prompt_bound = sum(content_bytes(m.get("content")) + 8 for m in messages) + 32
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
        """The open chat is streaming a reply, or running its tool calls (other chats may be streaming too:
        see streaming_ids)."""
        cid = self.messages.conversation_id
        return cid in self._replies or (self.tool_loop is not None and self.tool_loop.active(cid))

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
        """A new chat with the open one's parameters (system prompt, sampling: what the user set last), or
        the defaults; an empty chat already in the list is reused (opened, given those parameters) rather
        than a second "New chat" piled up."""
        current = self.current()
        keys = ("system_prompt", "temperature", "top_p", "max_tokens", *SAMPLING)
        params = {k: v for k, v in self.defaults.items() if k in keys}
        if current is not None:
            params.update({k: getattr(current, k) for k in keys})
        if current is not None and not self.messages.rowCount():
            return current  # an empty chat is already open: no second empty one
        empty = self.store.empty_conversation()
        if empty is not None and not self._replies.get(empty) and not self.has_documents(empty):
            self.store.update_conversation(empty, **params)
            self.conversations.touch(empty)  # to the top, where a new chat goes
            self._load(empty)
            return self.current()
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
    def send(self, text: str, images: list | None = None) -> bool:
        """Add the user's message (with `images`: content_parts.ChatImage) and stream the reply; False
        (nothing changed) if busy or empty."""
        if not self.queue(text, images):
            return False
        self._start_reply()
        return True

    def queue(self, text: str, images: list | None = None) -> bool:
        """Add the user's message without asking yet (the server is still loading); reply_to_last() asks
        once it is ready. The text is saved with the chat meanwhile, so nothing is lost if it never is."""
        text = text.strip()
        if not (text or images) or self.busy:
            return False
        conv = self.current() or self.new_conversation()
        if not self.messages.rowCount():
            self.conversations.rename(self.conversations.row_of(conv.id), title_from(text or images[0].name or "Image"))
        self.messages.append("user", text, images=images)
        return True

    def reply_to_last(self) -> bool:
        """Ask for the reply to the open chat's last message, when that is the user's (a queued send)."""
        last = self.messages.message(self.messages.rowCount() - 1)
        if self.busy or last is None or last.role != "user":
            return False
        self._start_reply()
        return True

    def regenerate(self, row: int | None = None) -> bool:
        """A new reply in place of the assistant's at `row` (default: the last one), as a new branch: the
        old reply and what followed it stay one flip (‹ 1/2 ›) away."""
        if self.busy:
            return False
        items = self.messages.messages()
        if row is None:
            row = max((i for i, m in enumerate(items) if m.role == "assistant"), default=-1)
            if items and items[-1].role == "user":  # a failed send left only the question
                self._start_reply()
                return True
        if 0 <= row < len(items) and items[row].role == "user":
            # A question left without a reply (its reply deleted): answered, as a new branch when another
            # message follows it.
            if row + 1 < len(items) and items[row + 1].role == "assistant":
                return False
            self.messages.cut_view(row + 1)
            self._start_reply()
            return True
        if not (0 <= row < len(items)) or items[row].role != "assistant":
            return False
        if not items[row].content and row == len(items) - 1:
            self.messages.remove_row(row)  # a failed or empty reply with nothing after it: replaced, not kept
        else:
            self.messages.cut_view(row)
        self._start_reply()
        return True

    def show_branch(self, row: int, index: int) -> bool:
        """Show another branch at `row` (‹ 2/3 ›): that message and the path that follows it; the chat goes on
        from what is shown. Not while the open chat is streaming (its rows would change under the reply)."""
        msg = self.messages.message(row)
        if self.busy or msg is None or not 0 <= index < len(msg.siblings):
            return False
        if msg.siblings[index] != msg.id:
            self.messages.show_branch(row, msg.siblings[index])
        return True

    def delete_message(self, row: int) -> bool:
        """Delete one message from the open chat (view and store): a message too long for the context, a
        failed reply. Not while the chat is streaming (rows would shift under the reply)."""
        if self.busy or self.messages.message(row) is None:
            return False
        self.messages.remove_row(row)
        return True

    def edit_and_rerun(self, row: int, text: str, images: list | None = None) -> bool:
        """Send `text` (and `images`) in place of the user's message at `row`, as a new branch there, and ask
        again; the original and its replies stay one flip away."""
        text = text.strip()
        msg = self.messages.message(row)
        if self.busy or not (text or images) or msg is None or msg.role != "user":
            return False
        self.messages.cut_view(row)
        self.messages.append("user", text, images=images)
        self._start_reply()
        return True

    def can_continue(self, row: int) -> bool:
        """The reply at `row` was cut short and is the chat's last message: Continue can finish it."""
        msg = self.messages.message(row)
        return (not self.busy and msg is not None and msg.role == "assistant" and bool(msg.content)
                and not msg.error and row == self.messages.rowCount() - 1 and is_cut_short(msg.stats))

    def continue_reply(self, row: int | None = None) -> str:
        """Ask the model to go on with the cut reply at `row` (default: the last message): it is sent as the
        conversation's unfinished last turn (vLLM's continue_final_message) and the rest is appended to it.
        Returns "" when it started, else why not (for the user)."""
        row = self.messages.rowCount() - 1 if row is None else row
        if not self.can_continue(row):
            return "Only the last reply, cut short (stopped or at max tokens), can be continued."
        conv = self.current()
        fit = self.fit_request(self.request_messages(), conv.max_tokens if conv else 1024)
        if fit.messages is None:
            return fit.note
        self.messages.streaming_row = row
        self._stream(row, fit, continuing=True)
        return ""

    def stop(self, conv_id: int | None = None, interrupted: str = "") -> None:
        """End the open chat's stream (or `conv_id`'s) now: the reply so far is kept with the stats
        measured until then, the connection closes, the server aborts. `interrupted`: why, when it was not
        the user's own Stop."""
        reply = self._replies.get(self.messages.conversation_id if conv_id is None else conv_id)
        if reply is None:
            if self.tool_loop is not None:
                self.tool_loop.cancel(self.messages.conversation_id if conv_id is None else conv_id)
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

    def _sent(self, row: int, msg: Message) -> bool:
        """Whether the message at `row` goes into the request: not the reply being written, nor a failed one."""
        return row != self.messages.streaming_row and msg.role in ("user", "assistant") and bool(
            msg.role == "user" or msg.content)

    def request_messages(self) -> list[dict]:
        """The shown path (the active branches) as the request's messages, the system prompt first; tool
        calls with their results (tool_loop.history_messages)."""
        conv = self.current()
        out = []
        if conv and conv.system_prompt.strip():
            out.append({"role": "system", "content": conv.system_prompt})
        items = self.messages.messages()
        if any(m.role == "tool" for m in items):
            return out + history_messages(items, skip_row=self.messages.streaming_row)
        out += [{"role": m.role, "content": message_content(m.content, m.images)}
                for i, m in enumerate(items) if self._sent(i, m)]
        return out

    def continue_after_tools(self) -> None:
        """The tool loop has every result of the open chat's calls: the model goes on from them."""
        if not self.busy:
            self._start_reply()

    def request_preview(self) -> dict:
        """The body the open chat's next request would send (messages fitted to the context, the model,
        sampling as set), for the developer view. Attached documents' passages are picked per message when
        it is sent, so they are not in it."""
        conv = self.current()
        max_tokens = conv.max_tokens if conv else 1024
        messages = self.fit_request(self.request_messages(), max_tokens).messages or self.request_messages()
        return ChatRequest(
            base_url=self.base_url, api_key=self.api_key,
            model=self.model or (conv.model if conv else "") or "default", messages=messages,
            temperature=conv.temperature if conv else 0.7, top_p=conv.top_p if conv else 0.95,
            max_tokens=self.fitting_max_tokens(max_tokens, messages),
            extra={**sampling_extra(conv),
                   **(self.tool_loop.request_fields(messages, peek=True)[0] if self.tool_loop else {})},
        ).body()

    def last_reply_stats(self) -> dict:
        """The stats of the open chat's latest finished reply (tokens, timings), {} when none."""
        return next((dict(m.stats) for i, m in reversed(list(enumerate(self.messages.messages())))
                     if m.role == "assistant" and i != self.messages.streaming_row and m.stats), {})

    def context_usage(self) -> tuple[int, int | None]:
        """Tokens the open chat's next request would take, estimated, and the context window (None: unknown).
        Where the server counted the latest reply's prompt, the estimate is off by what it was off then."""
        history = self.request_messages()
        docs = self.document_tokens(self.messages.conversation_id) if self.document_tokens else 0
        if not history and not docs:
            return 0, self.effective_context()
        used = estimate_tokens(history, TYPICAL_BYTES_PER_TOKEN) + docs
        items = self.messages.messages()
        counted = next((m.stats for i, m in reversed(list(enumerate(items)))
                        if m.role == "assistant" and "prompt_estimate" in m.stats and self._sent(i, m)), None)
        if counted is not None:
            used += int(counted["prompt_tokens"]) - int(counted["prompt_estimate"])
        return max(0, used), self.effective_context()

    def _start_reply(self) -> None:
        row = self.messages.append("assistant", "")
        self.messages.streaming_row = row
        conv = self.current()
        fit = self.fit_request(self.request_messages(), conv.max_tokens if conv else 1024)
        if fit.messages is None:  # policy "stop" (or nothing fits): said in place of the reply, nothing sent
            self.messages.finish(row, {"error_kind": "context"}, error=fit.note)
            self.reply_failed.emit("context", fit.note)
            return
        self._stream(row, fit)

    def _stream(self, row: int, fit: Fit, continuing: bool = False) -> None:
        """Stream the reply at `row` (the streaming row) for `fit`'s messages; `continuing`: they end with
        that very reply, cut short, which the model goes on with."""
        conv = self.current()
        max_tokens = conv.max_tokens if conv else 1024
        messages = fit.messages
        plan = None if self.documents is None else self.documents(self.messages.conversation_id, messages, max_tokens)
        extra = sampling_extra(conv)
        tool_note = ""
        if continuing:
            extra.update(continue_final_message=True, add_generation_prompt=False)
        elif self.tool_loop is not None:
            tool_fields, tool_note = self.tool_loop.request_fields(messages)
            extra.update(tool_fields)
        request = ChatRequest(
            base_url=self.base_url,
            api_key=self.api_key,
            model=self.model or (conv.model if conv else "") or "default",
            messages=messages,
            temperature=conv.temperature if conv else 0.7,
            top_p=conv.top_p if conv else 0.95,
            max_tokens=self.fitting_max_tokens(max_tokens, messages + (plan.padding() if plan else [])
                                               + tools_padding(extra)),
            extra=extra,
            prepare=plan,
        )
        worker = StreamWorker(request, self)
        worker.fit_key = (self.base_url, self.model)  # where a "too long" answer teaches the context's size
        worker.fit_context = self.effective_context()
        message = self.messages.message(row)
        note = "; ".join(n for n in (fit.note, tool_note) if n)
        reply = _Reply(self.messages.conversation_id, message, worker, context_note=note,
                       prior=dict(message.stats) if continuing else None,
                       prompt_estimate=estimate_tokens(messages, TYPICAL_BYTES_PER_TOKEN) + (
                           self.document_tokens(self.messages.conversation_id) if plan and self.document_tokens else 0))
        if conv is not None and request.model != conv.model:
            self.store.update_conversation(conv.id, model=request.model)  # the chat remembers its model
        self.store.begin_reply(reply.message.id)
        worker.reply = reply
        worker.delta.connect(self._on_delta)
        worker.reasoning.connect(self._on_reasoning)
        worker.first_token.connect(self._on_first_token)
        worker.done.connect(self._on_done)
        worker.failed.connect(self._on_failed)
        worker.prepared.connect(self._on_prepared)
        worker.sending.connect(self._on_sending)
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
                          (worker.failed, self._on_failed), (worker.first_token, self._on_first_token),
                          (worker.prepared, self._on_prepared), (worker.sending, self._on_sending)):
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
        self.request_ended.emit(reply.conv_id, reply.message.id, stats, error)
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

    def _on_prepared(self, info: dict) -> None:
        """The documents' passages the request was given: kept with the reply (its "Sources:" line)."""
        reply = self._reply_of_sender()
        if reply is None:
            return
        if info.get("note"):  # documents left out or cut to fit: said under the reply, as the history's cuts are
            reply.context_note = "; ".join(n for n in (reply.context_note, str(info["note"])) if n)
        if not info.get("sources"):
            return
        reply.message.stats["sources"] = info["sources"]
        if self._shown(reply):
            self.messages.touch_row(self.messages.streaming_row)

    def _on_sending(self, body: dict) -> None:
        reply = self._reply_of_sender()
        if reply is not None:
            self.request_sent.emit(reply.conv_id, reply.message.id, body)

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
        row = self.messages.streaming_row if self._shown(reply) else -1
        self._finish(reply, stats)
        self.conversations.touch(reply.conv_id)
        if reply.conv_id == self.messages.conversation_id:
            self.reply_finished.emit(stats)
        if self.tool_loop is not None and not stats.get("stopped"):
            # The model called tools: run them (a chat not open: when it is opened again).
            self.tool_loop.handle(reply.conv_id, row, stats)

    def _on_failed(self, kind: str, message: str) -> None:
        reply = self._reply_of_sender()
        if reply is None:
            return
        if kind == "context":
            message = self._learn_context(reply.worker, message)
        message = explain_refusal(message, reply.worker.request.messages)
        if (self.tool_loop is not None and self._shown(reply)
                and self.tool_loop.refused_auto(reply.worker.request.extra, message)):
            self._retry_without_tools(reply)
            return
        self._finish(reply, {"error_kind": kind}, error=message)
        if reply.conv_id == self.messages.conversation_id:
            self.reply_failed.emit(kind, message)

    def _retry_without_tools(self, reply: _Reply) -> None:
        """The server cannot let the model pick tools (no tool-call parser): ask again without them, saying
        so under the reply."""
        row = self.messages.streaming_row
        self._finish(reply, {})
        self.messages.remove_row(row)
        self._start_reply()
        new = self._replies.get(reply.conv_id)
        if new is not None:
            new.context_note = "; ".join(n for n in (new.context_note, NO_AUTO_NOTE) if n)

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
