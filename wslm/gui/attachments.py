"""Documents attached to chats: reading and embedding them off the GUI thread, the open chat's list of
them (a Qt model), and the retrieval plan a sent message gets (ChatSession.documents).

Holds no widgets; attachments_view shows it."""

from __future__ import annotations

from functools import partial

from PySide6.QtCore import QAbstractListModel, QModelIndex, QObject, Qt, Signal

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.embed_model import EMBED_NAME
from wslm.gui.background import BackgroundCall
from wslm.gui.chat_errors import normalize_base_url
from wslm.gui.context_fit import TYPICAL_BYTES_PER_TOKEN, reply_reserve
from wslm.gui.rag import DocumentError, EmbeddingEndpoint, Ingested, RetrievalPlan, ingest
from wslm.gui.rag_store import EMBEDDED, ERROR, READING, WHOLE, Attachment, RagStore
from wslm.gui.settings import Settings
from wslm.gui.token_count import TokenCounter, estimate_chat

IdRole = Qt.ItemDataRole.UserRole + 1
StatusRole = Qt.ItemDataRole.UserRole + 2
BLOCK_OVERHEAD_TOKENS = 96  # the documents block's own words around the passages
# The embedding model when none is set: the one that ships with wslm (wslm/embed_model.py), which our
# server's model pool serves under this name beside the chat model: attaching needs no second server.
DEFAULT_EMBED_MODEL = EMBED_NAME


def describe(att: Attachment) -> str:
    if att.status == READING:
        return "reading…"
    if att.status == WHOLE:
        return f"whole file, ~{att.tokens} tokens"
    if att.status == EMBEDDED:
        return f"{att.chunks} passage{'s' if att.chunks != 1 else ''}"
    return "could not be attached"


class AttachmentListModel(QAbstractListModel):
    """The open chat's attached files, in the order attached."""

    def __init__(self, store: RagStore, parent=None) -> None:
        super().__init__(parent)
        self.store = store
        self.conversation_id = 0
        self._items: list[Attachment] = []

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._items)

    def data(self, index: QModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        att = self._items[index.row()]
        if role == Qt.ItemDataRole.DisplayRole:
            return att.name
        if role == Qt.ItemDataRole.ToolTipRole:
            return f"{att.path}\n{att.error or describe(att)}"
        if role == IdRole:
            return att.id
        if role == StatusRole:
            return att.status
        return None

    def attachments(self) -> list[Attachment]:
        return list(self._items)

    def load(self, conv_id: int) -> None:
        self.beginResetModel()
        self.conversation_id = conv_id
        self._items = self.store.of_chat(conv_id) if conv_id else []
        self.endResetModel()


class Attachments(QObject):
    """Attach, read, embed and remove a chat's documents; hands ChatSession the plan for each send."""

    _reported = Signal(dict)  # a plan's report, crossing from the stream worker's thread
    failed = Signal(str)  # a file could not be attached: why, and what to do
    ready = Signal(int)  # an attachment's id: its file is read (and embedded) and will be used
    # A notice for the user about the chat's documents (a file that failed, passages left out of a request):
    # show it until notice_cleared, which comes when its cause is gone (a later attach or send went well).
    notice = Signal(str)
    notice_cleared = Signal(str)  # the notice that is no longer true (hide it if it is still shown)
    usage_changed = Signal()  # the open chat's documents changed: what they add to the context (usage_tokens)

    def __init__(self, session, settings: Settings, store: RagStore | None = None, parent=None) -> None:
        super().__init__(parent)
        self.session = session
        self.settings = settings
        self.store = store or RagStore(session.store.path)
        self.model = AttachmentListModel(self.store, self)
        self._jobs: dict[int, tuple[int, str, BackgroundCall]] = {}  # attachment id -> (chat id, name, reading)
        self._notice = ""  # the notice shown now ("" none)
        self.last_report: dict = {}  # what the latest send's plan used and left out
        session.current_changed.connect(self.model.load)
        session.current_changed.connect(lambda _id: self._clear_notice())  # it was about the chat left
        session.documents = self.plan
        session.document_tokens = self.usage_tokens
        self.model.modelReset.connect(self.usage_changed)
        self._reported.connect(self._on_report)  # from the stream worker's thread to this one
        self.model.load(session.messages.conversation_id)

    def close(self) -> None:
        self.store.close()

    # Where passages are embedded
    def embed_setting(self) -> tuple[str, EmbeddingEndpoint]:
        """(the URL as set, "" for the chat's own server; the endpoint to use now)."""
        own_url = normalize_base_url(self.settings.rag_embed_base_url)
        url = own_url or self.session.base_url
        key = self.settings.rag_embed_api_key if own_url else self.session.api_key
        model = self.settings.rag_embed_model.strip() or DEFAULT_EMBED_MODEL
        return own_url, EmbeddingEndpoint(url, model, key)

    def _endpoint_for(self, stored_url: str, model: str) -> EmbeddingEndpoint:
        """A query is embedded where the chat's passages were: their URL ("" = the chat's server, wherever
        it runs now) and model."""
        if stored_url:
            own = normalize_base_url(self.settings.rag_embed_base_url)
            return EmbeddingEndpoint(stored_url, model, self.settings.rag_embed_api_key if own == stored_url else "")
        return EmbeddingEndpoint(self.session.base_url, model, self.session.api_key)

    # Attaching
    def attach(self, paths: list[str]) -> list[int]:
        """Attach files to the open chat (a new one when none is open); each is read in the background."""
        paths = [str(p) for p in paths if str(p)]
        if not paths:
            return []
        conv = self.session.current() or self.session.new_conversation()
        ids = []
        stored_url, endpoint = self.embed_setting()
        whole, chunk = self.whole_file_limit(), self.settings.rag_chunk_chars
        for path in paths:
            att = self.store.add(conv.id, path)
            call = BackgroundCall(partial(_ingest, path, endpoint, whole, chunk), self)
            call.done.connect(lambda result, a=att.id, u=stored_url, m=endpoint.model: self._done(a, result, u, m))
            call.failed.connect(lambda error, a=att.id: self._done(a, DocumentError(error), "", ""))
            self._jobs[att.id] = (conv.id, att.name, call)
            ids.append(att.id)
            call.start()
        self._reload(conv.id)
        return ids

    def whole_file_limit(self) -> int:
        """Files up to this many (estimated) tokens go in whole: the setting, but never over half the known
        context, so that a whole file leaves the conversation and the reply their room; a larger one is
        searched in passages instead of being cut or left out at every send."""
        limit = self.settings.rag_whole_file_tokens
        context = self.session.effective_context()
        return min(limit, context // 2) if context else limit

    def busy(self, conv_id: int | None = None) -> list[str]:
        """Names of the files the chat (default: the open one) is still reading."""
        conv_id = self.session.messages.conversation_id if conv_id is None else conv_id
        return [name for c, name, _ in self._jobs.values() if c == conv_id]

    def remove(self, att_id: int) -> None:
        self._jobs.pop(att_id, None)  # a reading still running finds its row gone and stores nothing
        self.store.remove(att_id)
        self._reload(self.model.conversation_id)
        if not any(a.status == ERROR for a in self.model.attachments()):
            self._clear_notice()

    # Notices
    def _show_notice(self, text: str) -> None:
        self._notice = text
        self.notice.emit(text)

    def _clear_notice(self) -> None:
        if self._notice:
            old, self._notice = self._notice, ""
            self.notice_cleared.emit(old)

    def notice_text(self) -> str:
        """The notice shown now ("" when none)."""
        return self._notice

    def _on_report(self, info: dict) -> None:
        """A send's plan ran: say what was left out of the request, or clear a stale notice of that kind."""
        self.last_report = info
        if info.get("note"):
            self._show_notice(str(info["note"]))
        elif self._notice and not any(a.status == ERROR for a in self.model.attachments()):
            self._clear_notice()

    # The context meter (ChatSession.document_tokens)
    def usage_tokens(self, conv_id: int) -> int:
        """About how many tokens the chat's documents add to its next request: whole files, and its top
        passages (estimated from their size; the request itself is counted exactly)."""
        if not conv_id:
            return 0
        usable = [a for a in self.store.of_chat(conv_id) if a.status in (WHOLE, EMBEDDED)]
        if not usable:
            return 0
        tokens = sum(a.tokens for a in usable if a.status == WHOLE)
        passages = min(self.settings.rag_top_k, sum(a.chunks for a in usable if a.status == EMBEDDED))
        tokens += int(passages * self.settings.rag_chunk_chars / TYPICAL_BYTES_PER_TOKEN)
        return tokens + BLOCK_OVERHEAD_TOKENS

    def _done(self, att_id: int, result: Ingested | DocumentError, url: str, model: str) -> None:
        job = self._jobs.pop(att_id, None)
        if job is None:
            return  # removed meanwhile
        if isinstance(result, DocumentError):
            self.store.fail(att_id, str(result))
            self._reload(job[0])
            self.failed.emit(str(result))
            self._show_notice(str(result))
            return
        if self.store.finish(att_id, result, url, model):
            self._reload(job[0])
            self.ready.emit(att_id)
            if not self._jobs or not any(c == job[0] for c, _n, _j in self._jobs.values()):
                self._clear_notice()  # the chat's files are all read now: an earlier failure's notice is stale

    def _reload(self, conv_id: int) -> None:
        if conv_id == self.model.conversation_id:
            self.model.load(conv_id)

    # Sending (ChatSession.documents)
    def plan(self, conv_id: int, messages: list[dict], max_tokens: int) -> RetrievalPlan | None:
        """What a message sent now in the chat gets from its documents; None when it has none."""
        usable = [a for a in self.store.of_chat(conv_id) if a.status in (WHOLE, EMBEDDED)]
        if not usable:
            return None
        endpoints = {(a.embed_url, a.embed_model): self._endpoint_for(a.embed_url, a.embed_model)
                     for a in usable if a.status == EMBEDDED}
        context = self.session.effective_context()
        conv = self.session.current()
        model = self.session.model or (conv.model if conv else "") or "default"  # as ChatSession sends it
        # Tokens are counted in the stream worker by the chat model's own tokenizer (its server's /tokenize).
        counter = TokenCounter(self.session.base_url, model, self.session.api_key) if self.session.base_url else None
        room = None
        if context:  # the documents' most (estimated here; counted exactly there), for the reply's max tokens
            room = max(0, context - estimate_chat(messages) - reply_reserve(context, max_tokens))
        return RetrievalPlan(self.store.path, conv_id, endpoints, top_k=self.settings.rag_top_k, context=context,
                             max_tokens=max_tokens, counter=counter,
                             report=self._reported.emit, room_estimate=room)


def _ingest(path: str, endpoint: EmbeddingEndpoint, whole: int, chunk: int) -> Ingested | DocumentError:
    """ingest() on a worker thread; a DocumentError comes back as a value (its message is for the user as is)."""
    try:
        return ingest(path, endpoint, whole, chunk)
    except DocumentError as exc:
        return exc

