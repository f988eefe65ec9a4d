"""Documents in chat (RAG), the parts without Qt: read a file (text, Markdown, PDF), cut it into passages,
embed them through an OpenAI-style /v1/embeddings, and pick the passages nearest to a message.

Everything here blocks (file reading, HTTP): the GUI calls it from worker threads only. Vectors are stored
as little-endian float32 blobs; cosine similarity is computed in plain Python (a chat holds at most a few
thousand passages, and the GUI has no numpy dependency)."""

from __future__ import annotations

import math
import operator
import re
import sqlite3
import sys
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from wslm.gui.chat_errors import _server_message
from wslm.gui.content_parts import text_of, with_text
from wslm.gui.context_fit import cut_middle, reply_reserve
from wslm.gui.token_count import TokenCounter

# A file under this many estimated tokens goes into the context whole (no embeddings), as LM Studio does.
WHOLE_FILE_TOKENS = 2000
BYTES_PER_TOKEN = 4  # English text; only decides "whole or passages", not what fits the context
CHUNK_CHARS = 1000  # a passage: small enough for any embedding model's context (bge-small: 512 tokens)
CHUNK_OVERLAP = 150  # a paragraph longer than a passage is cut with this much repeated at each cut
TOP_K = 4
EMBED_BATCH = 32
MAX_FILE_BYTES = 50 << 20
MAX_CHUNKS = 5000
WHOLE_SOURCE_CHARS = 2000  # how much of a whole file a reply's citation keeps (for the hover/click view)
PDF_NEEDS_PYPDF = ("Reading PDF files needs the pypdf package: install it into the app's environment "
                   "(pip install pypdf), then attach the file again. Text and Markdown files work without it.")

_HEADING = re.compile(r"^\s{0,3}#{1,6}\s")


class DocumentError(Exception):
    """A file could not be read, or its passages not embedded or searched; the message says why and what to do."""


@dataclass
class Passage:
    label: str  # the citation: "notes.md §2", "paper.pdf p. 3"
    text: str


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN)


# ---- reading --------------------------------------------------------------------------------------------
def read_document(path: str | Path) -> list[tuple[int | None, str]]:
    """The file's text as (page, text) segments: one per page for a PDF (page from 1), one (None, text) else."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise DocumentError(f"Cannot read {path.name}: {exc.strerror or exc}") from exc
    if size > MAX_FILE_BYTES:
        raise DocumentError(f"{path.name} is too large to attach ({size >> 20} MiB; at most {MAX_FILE_BYTES >> 20}).")
    if path.suffix.lower() == ".pdf":
        return _read_pdf(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DocumentError(f"Cannot read {path.name}: {exc.strerror or exc}") from exc
    return [(None, _decode(raw, path.name))]


def _decode(raw: bytes, name: str) -> str:
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        return raw.decode("utf-16", "replace")
    if b"\0" in raw[:4096]:
        raise DocumentError(f"{name} is not a text file: attach text, Markdown or PDF files.")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        return raw.decode("cp1252", "replace")  # Windows' usual 8-bit text


def _read_pdf(path: Path) -> list[tuple[int | None, str]]:
    try:
        from pypdf import PdfReader
    except ImportError:
        raise DocumentError(f"{path.name}: {PDF_NEEDS_PYPDF}") from None
    try:
        reader = PdfReader(str(path))
        pages = [(i + 1, page.extract_text() or "") for i, page in enumerate(reader.pages)]
    except Exception as exc:  # noqa: BLE001 - pypdf raises many kinds for broken or encrypted files
        raise DocumentError(f"Cannot read the PDF {path.name}: {exc}") from exc
    if not any(text.strip() for _, text in pages):
        raise DocumentError(f"{path.name} has no text to read (a scanned PDF has only images of pages).")
    return pages


# ---- passages -------------------------------------------------------------------------------------------
def split_text(text: str, size: int = CHUNK_CHARS, overlap: int = CHUNK_OVERLAP) -> list[str]:
    """Passages of about `size` characters along paragraph lines; a Markdown heading starts a new passage
    once the current one is a quarter full, so that a passage tends to hold one section."""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text.replace("\r\n", "\n")) if p.strip()]
    out: list[str] = []
    cur = ""
    for para in paragraphs:
        if cur and _HEADING.match(para) and len(cur) >= size // 4:
            out.append(cur)
            cur = ""
        for piece in _cut(para, size, overlap):
            if cur and len(cur) + 2 + len(piece) > size:
                out.append(cur)
                cur = ""
            cur = f"{cur}\n\n{piece}" if cur else piece
    if cur:
        out.append(cur)
    return out


def _cut(text: str, size: int, overlap: int) -> list[str]:
    """A paragraph longer than a passage, cut at spaces, each cut repeating `overlap` characters."""
    pieces = []
    while len(text) > size:
        end = text.rfind(" ", size // 2, size)
        end = end if end > 0 else size
        pieces.append(text[:end].strip())
        start = max(end - overlap, 1)
        space = text.find(" ", start, end)
        text = text[space + 1 if space >= 0 else start:]
    if text.strip():
        pieces.append(text.strip())
    return pieces


def passages(name: str, segments: list[tuple[int | None, str]], size: int = CHUNK_CHARS) -> list[Passage]:
    """A file's passages with their citation labels: "§n" in order, "p. n" (and §n within a page) for a PDF."""
    out: list[Passage] = []
    for page, text in segments:
        parts = split_text(text, size)
        for i, part in enumerate(parts):
            if page is None:
                label = f"{name} §{len(out) + 1}"
            else:
                label = f"{name} p. {page}" + (f" §{i + 1}" if len(parts) > 1 else "")
            out.append(Passage(label, part))
    if len(out) > MAX_CHUNKS:
        raise DocumentError(f"{name} is too long to search ({len(out)} passages; at most {MAX_CHUNKS}).")
    return out


# ---- vectors --------------------------------------------------------------------------------------------
def pack(vector: list[float]) -> bytes:
    a = array("f", vector)
    if sys.byteorder == "big":
        a.byteswap()
    return a.tobytes()


def unpack(blob: bytes) -> array:
    a = array("f")
    a.frombytes(blob)
    if sys.byteorder == "big":
        a.byteswap()
    return a


def cosine(a, b) -> float:
    dot = sum(map(operator.mul, a, b))
    na = math.sqrt(sum(map(operator.mul, a, a)))
    nb = math.sqrt(sum(map(operator.mul, b, b)))
    return dot / (na * nb) if na and nb else 0.0


@dataclass
class EmbeddingEndpoint:
    base_url: str  # OpenAI-style, ends in /v1
    model: str
    api_key: str = ""


def embed(endpoint: EmbeddingEndpoint, texts: list[str], timeout: float = 120.0) -> list[list[float]]:
    """Vectors for `texts` from the endpoint's /embeddings, in order. Raises DocumentError with the fix."""
    if not endpoint.base_url:
        raise DocumentError("No server to make embeddings with: start the server, or set an embedding server "
                            "under Documents in the chat's settings (⚙).")
    url = endpoint.base_url.rstrip("/") + "/embeddings"
    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    out: list[list[float]] = []
    # vLLM's (and wslm's) truncate_prompt_tokens cuts a passage longer than the embedding model's context
    # instead of refusing it; a server that rejects the unknown field is asked again without it.
    truncate = True
    try:
        with httpx.Client(timeout=httpx.Timeout(timeout, connect=5.0)) as client:
            for i in range(0, len(texts), EMBED_BATCH):
                body = {"model": endpoint.model, "input": texts[i:i + EMBED_BATCH], "encoding_format": "float"}
                resp = client.post(url, json={**body, "truncate_prompt_tokens": -1} if truncate else body,
                                   headers=headers)
                if truncate and resp.status_code in (400, 422) and "truncate_prompt_tokens" in resp.text:
                    truncate = False
                    resp = client.post(url, json=body, headers=headers)
                if resp.status_code >= 400:
                    raise DocumentError(_embed_error(endpoint, resp.status_code, resp.text))
                data = sorted(resp.json()["data"], key=lambda d: d.get("index", 0))
                out += [list(d["embedding"]) for d in data]
    except httpx.ConnectError:
        raise DocumentError(f"Cannot reach {endpoint.base_url} to make embeddings: start the server, or fix "
                            "the embedding server under Documents in the chat's settings (⚙).") from None
    except httpx.HTTPError as exc:
        raise DocumentError(f"Embedding request to {endpoint.base_url} failed: {type(exc).__name__}: {exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise DocumentError(f"{endpoint.base_url} sent an unexpected /embeddings answer ({exc}).") from None
    if len(out) != len(texts):
        raise DocumentError(f"{endpoint.base_url} sent {len(out)} embeddings for {len(texts)} passages.")
    return out


def _embed_error(endpoint: EmbeddingEndpoint, status: int, body: str) -> str:
    detail = _server_message(body) or f"HTTP {status}"
    if status in (401, 403):
        return f"{endpoint.base_url} refused the API key for embeddings ({detail})."
    return (f"{endpoint.base_url} could not make embeddings with “{endpoint.model}” ({detail}). Serve an "
            "embedding model and set it under Documents in the chat's settings (⚙).")


# ---- ingestion (a worker thread) ------------------------------------------------------------------------
@dataclass
class Ingested:
    kind: str  # "whole": the text goes into the context as it is; "embedded": passages with vectors
    tokens: int
    text: str = ""  # kind "whole"
    passages: list[Passage] = field(default_factory=list)  # kind "embedded"
    vectors: list[bytes] = field(default_factory=list)


def ingest(path: str | Path, endpoint: EmbeddingEndpoint, whole_tokens: int = WHOLE_FILE_TOKENS,
           chunk_chars: int = CHUNK_CHARS) -> Ingested:
    """Read a file; a small one is kept whole, a larger one is cut into passages and embedded."""
    path = Path(path)
    segments = read_document(path)
    text = "\n\n".join(t for _, t in segments).strip()
    if not text:
        raise DocumentError(f"{path.name} is empty.")
    tokens = estimate_tokens(text)
    if tokens <= whole_tokens:
        return Ingested("whole", tokens, text=text)
    parts = passages(path.name, segments, chunk_chars)
    vectors = embed(endpoint, [p.text for p in parts])
    return Ingested("embedded", tokens, passages=parts, vectors=[pack(v) for v in vectors])


# ---- retrieval (the chat's stream worker, before it sends) ----------------------------------------------
CONTEXT_HEAD = ("The user attached documents to this chat. Passages from them follow, each under its label; "
                "use them to answer, and name the label (e.g. [{example}]) of a passage you rely on.")


@dataclass
class Source:
    label: str
    name: str
    text: str
    score: float | None = None  # cosine similarity; None for a whole file

    def as_dict(self) -> dict:
        return {"label": self.label, "name": self.name, "text": self.text,
                **({"score": round(self.score, 4)} if self.score is not None else {})}


@dataclass
class RetrievalPlan:
    """What a message sent in a chat with documents gets: built on the GUI thread (cheap: no file, no HTTP),
    run by the stream worker before it sends. Reads the chat's passages through its own SQLite connection.

    With a known context (ours, or the one the chat server's /tokenize reports) the documents are fitted by
    counting tokens with the chat model's own tokenizer (token_count.TokenCounter: /tokenize, else an
    estimate of 2 bytes a token): whole files first, then passages by similarity. A whole file that does not fit
    goes in cut to the room left; anything left out is counted and said (`note`, and `report`)."""

    db_path: str
    conversation_id: int
    endpoints: dict[tuple[str, str], EmbeddingEndpoint]  # (stored URL or "", model) -> where to embed a query
    top_k: int = TOP_K
    context: int | None = None  # the chat model's context window (None: unknown; /tokenize may tell)
    max_tokens: int = 0  # the reply's max tokens: its room is kept (context_fit.reply_reserve)
    counter: TokenCounter | None = None  # the chat model's tokens (None: estimated)
    report: Callable[[dict], None] | None = None  # told what was used and left out (the GUI's notice)
    room_estimate: int | None = None  # tokens the GUI thread expects the documents may take (padding())

    def padding(self) -> list[dict]:
        """A stand-in for the block this plan may add, for estimating whether the reply still fits."""
        return [{"content": "x" * self.room_estimate}] if self.room_estimate else []

    def __call__(self, messages: list[dict]) -> tuple[list[dict], dict]:
        """(messages with the documents' block put before the last user message's text, {"sources": [...],
        "left_out": n, "note": what was left out or cut, for the user})."""
        try:
            out, info = self._run(messages)
        finally:
            if self.counter is not None:
                self.counter.close()
        if self.report is not None:
            self.report(info)
        return out, info

    def _run(self, messages: list[dict]) -> tuple[list[dict], dict]:
        last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
        if last < 0:
            return messages, {"sources": []}
        query = text_of(messages[last].get("content"))
        sources = self.sources(query)
        chosen, left, cut = self._fit(messages, last, query, sources)
        info: dict = {"sources": [], "used": len(chosen), "left_out": len(left)}
        note = _note(left, cut)
        if note:
            info["note"] = note
        if not chosen:
            return messages, info
        out = _with_block(messages, last, query, chosen)
        cited = [Source(s.label, s.name, s.text[:WHOLE_SOURCE_CHARS] if s.score is None else s.text, s.score)
                 for s in chosen]
        info["sources"] = [s.as_dict() for s in cited]
        return out, info

    def sources(self, query: str) -> list[Source]:
        """Whole files first (in the order attached), then the top passages by cosine similarity."""
        try:
            db = sqlite3.connect(self.db_path, timeout=10)
            try:
                whole = db.execute("SELECT name, text FROM attachments WHERE conversation_id = ? AND status = 'whole' "
                                   "ORDER BY id", (self.conversation_id,)).fetchall()
                rows = db.execute(
                    "SELECT a.embed_url, a.embed_model, a.name, c.label, c.text, c.vector FROM attachment_chunks c "
                    "JOIN attachments a ON a.id = c.attachment_id WHERE a.conversation_id = ? "
                    "AND a.status = 'embedded' ORDER BY c.id", (self.conversation_id,)).fetchall()
            finally:
                db.close()
        except sqlite3.Error as exc:
            raise DocumentError(f"Could not read the chat's documents: {exc}") from exc
        out = [Source(name, name, text) for name, text in whole]
        if not rows or self.top_k <= 0:
            return out
        # Passages embedded by different models are compared with the query embedded by each one's own model.
        queries = {}
        for key in {(r[0], r[1]) for r in rows}:
            endpoint = self.endpoints.get(key)
            if endpoint is None:
                continue
            queries[key] = embed(endpoint, [query])[0]
        scored = [Source(label, name, text, cosine(queries[(url, model)], unpack(blob)))
                  for url, model, name, label, text, blob in rows if (url, model) in queries]
        scored.sort(key=lambda s: -s.score)
        return out + scored[: self.top_k]

    def _fit(self, messages: list[dict], last: int, query: str,
             sources: list[Source]) -> tuple[list[Source], list[Source], list[str]]:
        """(the sources that fit, in order; those left out; names of whole files cut to fit)."""
        if not sources:
            return [], [], []
        counter = self.counter or TokenCounter("", "")
        total = None
        if self.context is None:  # learn the window from /tokenize (its max_model_len)
            if counter.exact:
                total = counter.chat(_with_block(messages, last, query, sources))
            if counter.context is None:
                return sources, [], []  # unknown window: sent as they are (the server says if it is too long)
            self.context = counter.context
        limit = self._limit()
        if total is None:
            total = counter.chat(_with_block(messages, last, query, sources))
        if total <= limit:  # the usual case: everything fits
            return sources, [], []
        room = limit - counter.chat(messages) - counter.text(_block_head(sources[0].label, query)) - 8
        chosen: list[Source] = []
        left: list[Source] = []
        cut: list[str] = []
        for s in sources:
            need = counter.text(_source_block(s)) + 4
            if need <= room:
                chosen.append(s)
                room -= need
            elif s.score is None and room > 256:  # a whole file: as much of it as the room holds
                shorter = _cut_to(s, room - 64, counter)
                if shorter is not None:
                    chosen.append(shorter)
                    cut.append(s.name)
                    room -= counter.text(_source_block(shorter)) + 4
                else:
                    left.append(s)
            else:
                left.append(s)
        # Separately counted pieces may not add up exactly: check the whole prompt, dropping from the end.
        while chosen and counter.chat(_with_block(messages, last, query, chosen)) > limit:
            dropped = chosen.pop()
            if dropped.name in cut and dropped.score is None:
                cut.remove(dropped.name)
            left.insert(0, dropped)
        return chosen, left, cut

    def _limit(self) -> int:
        return (self.context or 0) - reply_reserve(self.context or 0, self.max_tokens)


def _block_head(example: str, query: str) -> str:
    return CONTEXT_HEAD.format(example=example) + f"\n\nThe user's message:\n{query}"


def _source_block(s: Source) -> str:
    return f"[{s.label}]{' (whole file)' if s.score is None else ''}\n{s.text}"


def _with_block(messages: list[dict], last: int, query: str, chosen: list[Source]) -> list[dict]:
    block = CONTEXT_HEAD.format(example=chosen[0].label) + "\n\n" + "\n\n".join(_source_block(s) for s in chosen)
    out = [dict(m) for m in messages]
    out[last]["content"] = with_text(out[last].get("content"), f"{block}\n\nThe user's message:\n{query}")
    return out


def _cut_to(s: Source, tokens: int, counter: TokenCounter) -> Source | None:
    """A whole file cut in the middle to about `tokens` tokens (None when that leaves too little)."""
    have = counter.text(s.text)
    if tokens < 128 or have <= 0:
        return None
    ratio = len(s.text.encode("utf-8")) / have  # this file's bytes a token
    text = cut_middle(s.text, int(tokens * ratio * 0.95))
    while text and counter.text(text) > tokens:
        text = cut_middle(s.text, int(len(text.encode("utf-8")) * 0.9))
    return Source(s.label, s.name, text) if text else None


def _note(left: list[Source], cut: list[str]) -> str:
    """What the user is told about documents that did not fit (empty: everything fitted)."""
    parts = []
    if cut:
        parts.append(f"{', '.join(cut)} did not fit the model's context whole: its middle was left out")
    if left:
        whole = [s.name for s in left if s.score is None]
        passages = [s.label for s in left if s.score is not None]
        if whole:
            parts.append(f"{', '.join(whole)} did not fit the model's context and was left out")
        if passages:
            n = len(passages)
            parts.append(f"{n} passage{'s' if n != 1 else ''} ({', '.join(passages)}) did not fit the model's "
                         "context and " + ("were" if n != 1 else "was") + " left out")
    if not parts:
        return ""
    return ("; ".join(parts) + ". Start a new chat, use a model with a longer context, lower “Whole file ≤” "
            "(the file is then searched in passages) or fewer passages under Documents (⚙).")
