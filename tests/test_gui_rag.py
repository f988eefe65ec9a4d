"""Documents in chat (RAG) on real widgets: two files attached to a chat (a small one that goes in whole, a
larger one cut into passages embedded by a real `wslm serve` with a tiny random BERT); a question about a
fact in the larger one sends that passage (and the small file) to the chat server, a loopback fake that
records the request, and the reply shows "Sources: notes.md §3" with the passage on hover and click.
Deleting the chat deletes its documents. Also: reading PDFs (pypdf) and what is said without it, passages'
labels, an embedding server that cannot embed."""

from __future__ import annotations

import json
import re
import sqlite3
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("PySide6")

from PySide6.QtCore import QUrl  # noqa: E402

from wslm.gui import rag  # noqa: E402
from wslm.gui.chat_panel import ChatPanel  # noqa: E402
from wslm.gui.chat_session import ChatSession  # noqa: E402
from wslm.gui.chat_store import ChatStore  # noqa: E402
from wslm.gui.rag_store import EMBEDDED, ERROR, WHOLE  # noqa: E402
from wslm.gui.settings import Settings  # noqa: E402

NOTES = """# Field notes

## Garden
The garden has tall green grass and a red apple tree. Bees visit the flowers every warm morning in spring.

## Kitchen
The kitchen oven bakes fresh bread daily. Copper pots hang over the stove beside jars of salt and sugar.

## Harbor
The lighthouse keeper is called Mira. She lights the lamp at dusk and watches the ships sail past the rocks.

## Library
Old maps and atlases fill the library shelves. A brass telescope stands near the window facing north.

## Stable
Two brown horses sleep in the stable. Fresh hay is stacked in the loft above the wooden doors.
"""
FACT = "The lighthouse keeper is called Mira."
TODO = "Buy milk, eggs and candles for the cabin."
QUESTION = "What is the lighthouse keeper called?"


class ChatRecorder(BaseHTTPRequestHandler):
    """A chat server: records each request's body and streams a reply citing the passage."""

    requests: list[dict] = []

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not self.path.endswith("/chat/completions"):  # no embeddings here
            data = json.dumps({"error": {"message": "no such endpoint"}}).encode()
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        type(self).requests.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for text in ("The keeper is Mira ", "[notes.md §3]."):
            chunk = {"model": body["model"], "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n')
        self.wfile.flush()


@pytest.fixture
def chat_server():
    ChatRecorder.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), ChatRecorder)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def embed_server(tmp_path_factory):
    """A real `wslm serve` with a tiny random BERT (mean pooling) whose vocabulary holds every word used here."""
    pytest.importorskip("sentence_transformers")
    from test_embeddings import make_encoder
    from test_server_helpers import ServerProcess

    words = list(dict.fromkeys(re.findall(r"\w+|[^\w\s]", (NOTES + TODO + QUESTION).lower())))
    folder, _ = make_encoder(tmp_path_factory.mktemp("ragbert"), "bert", "mean", seed=5, words=words)
    srv = ServerProcess(str(folder), "--port", "0", "--uvicorn-log-level", "warning", "--shutdown-timeout", "0",
                        "--served-model-name", "bert")
    yield srv
    srv.stop()


def make_panel(qtbot, tmp_path, chat_url: str, **settings) -> ChatPanel:
    store = ChatStore(tmp_path / "chats.sqlite3")
    session = ChatSession(store, {"system_prompt": ""})
    s = Settings(chat_use_server=False, chat_base_url=chat_url, chat_model="chatty", system_prompt="", **settings)
    panel = ChatPanel(session, s)
    qtbot.addWidget(panel)
    panel.show()
    return panel


def close(panel: ChatPanel) -> None:
    panel.session.shutdown()
    panel.attachments.close()
    panel.session.store.close()


def test_attached_documents_answer_with_citation(qtbot, tmp_path, chat_server, embed_server):
    notes, todo = tmp_path / "notes.md", tmp_path / "todo.txt"
    notes.write_text(NOTES)
    todo.write_text(TODO)
    # Passages of ~300 characters (one section each), files over 60 tokens embedded, 2 passages a message.
    panel = make_panel(qtbot, tmp_path, chat_server, rag_embed_base_url=embed_server.base_url,
                       rag_embed_model="bert", rag_whole_file_tokens=60, rag_chunk_chars=300, rag_top_k=2)
    try:
        panel.attach_files([str(notes), str(todo)])
        assert panel.attachments.busy()  # read in the background
        qtbot.waitUntil(lambda: not panel.attachments.busy(), timeout=60_000)
        atts = {a.name: a for a in panel.attachments.model.attachments()}
        assert atts["notes.md"].status == EMBEDDED, atts["notes.md"].error
        assert atts["notes.md"].chunks == 5 and atts["notes.md"].embed_model == "bert"
        assert atts["todo.txt"].status == WHOLE
        assert set(panel.attachment_bar.chips) == {a.id for a in atts.values()} and panel.attachment_bar.isVisible()

        panel.input.setPlainText(QUESTION)
        with qtbot.waitSignal(panel.session.reply_finished, timeout=30_000):
            panel.send()
        # The request: the passage with the fact and the small file, whole, before the question; not
        # every passage (2 of 5 were picked by cosine similarity to the question's embedding).
        sent = ChatRecorder.requests[-1]["messages"][-1]["content"]
        assert FACT in sent and TODO in sent and sent.endswith(QUESTION)
        assert "[notes.md §3]" in sent and "[todo.txt] (whole file)" in sent
        assert sum(f"[notes.md §{i}]" in sent for i in range(1, 6)) == 2
        # The reply cites it; the stored message keeps the question as typed.
        msgs = panel.session.messages.messages()
        assert msgs[0].content == QUESTION
        sources = msgs[-1].stats["sources"]
        labels = [s["label"] for s in sources]
        assert labels[0] == "todo.txt" and "notes.md §3" in labels and len(labels) == 3
        fact = labels.index("notes.md §3")
        assert FACT in sources[fact]["text"] and sources[fact]["score"] > 0
        view = panel.view
        view.render()
        text = view.toPlainText()
        assert "Sources: " + ", ".join(labels) in text and FACT not in text
        assert FACT in anchor_tooltip(view, f"src:1:{fact}")  # hover
        view._on_link(QUrl(f"src:1:{fact}"))  # click: the passage unfolds under the line
        assert FACT in view.toPlainText()
        # It survives a restart (the stats are stored).
        again = ChatStore(panel.session.store.path)
        assert again.messages(msgs[-1].conversation_id)[-1].stats["sources"] == sources
        again.close()

        # Remove one file (×), then delete the chat: its documents go with it.
        panel.attachment_bar.chips[atts["todo.txt"].id].remove_button.click()
        assert [a.name for a in panel.attachments.model.attachments()] == ["notes.md"]
        assert panel.attachments.store.chunk_count() == 5
        panel._delete(0, confirm=False)
        assert panel.attachments.store.chunk_count() == 0
        db = sqlite3.connect(str(panel.session.store.path))
        assert db.execute("SELECT COUNT(*) FROM attachments").fetchone()[0] == 0
        db.close()
    finally:
        close(panel)


def test_embedding_failure_is_said_and_small_files_need_no_server(qtbot, tmp_path, chat_server):
    """The chat server cannot embed (404): the large file is marked with why; the small one works."""
    big, small = tmp_path / "big.md", tmp_path / "small.txt"
    big.write_text(NOTES)
    small.write_text(TODO)
    panel = make_panel(qtbot, tmp_path, chat_server, rag_whole_file_tokens=60)
    try:
        with qtbot.waitSignal(panel.attachments.failed, timeout=20_000) as failed:
            panel.attach_files([str(big), str(small)])
        assert "could not make embeddings" in failed.args[0] and "Documents" in failed.args[0]
        qtbot.waitUntil(lambda: not panel.attachments.busy(), timeout=20_000)
        status = {a.name: a.status for a in panel.attachments.model.attachments()}
        assert status == {"big.md": ERROR, "small.txt": WHOLE}
        assert panel.error_label.isVisible()
        panel.input.setPlainText("what should I buy?")
        with qtbot.waitSignal(panel.session.reply_finished, timeout=20_000):
            panel.send()
        assert TODO in ChatRecorder.requests[-1]["messages"][-1]["content"]
    finally:
        close(panel)


def tiny_pdf(pages: list[str]) -> bytes:
    """A valid PDF with one line of Helvetica text per page."""
    n = len(pages)
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(b"%d 0 R" % (4 + 2 * i) for i in range(n)), n),
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    for i, text in enumerate(pages):
        content = b"BT /F1 12 Tf 20 100 Td (%s) Tj ET" % text.encode("latin-1")
        objs.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 400 144] /Contents %d 0 R "
                    b"/Resources << /Font << /F1 3 0 R >> >> >>" % (5 + 2 * i))
        objs.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content))
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for i, obj in enumerate(objs):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (i + 1, obj)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)


def test_pdf_pages_and_passage_labels(tmp_path, monkeypatch):
    pdf = tmp_path / "paper.pdf"
    pdf.write_bytes(tiny_pdf(["Results are on page one.", "The method is on page two."]))
    if _has_pypdf():
        segments = rag.read_document(pdf)
        assert [p for p, _ in segments] == [1, 2] and "page two" in segments[1][1]
        labels = [p.label for p in rag.passages("paper.pdf", segments)]
        assert labels == ["paper.pdf p. 1", "paper.pdf p. 2"]
    # Without pypdf: a clear message saying what to install (text and Markdown still work).
    monkeypatch.setitem(sys.modules, "pypdf", None)
    with pytest.raises(rag.DocumentError, match="pip install pypdf"):
        rag.read_document(pdf)
    # Text: passages along paragraphs, a heading starting a new one, long paragraphs cut with overlap.
    parts = rag.split_text(NOTES, 300)
    assert len(parts) == 5 and parts[2].startswith("## Harbor") and FACT in parts[2]
    long = " ".join(f"word{i}" for i in range(400))
    cut = rag.split_text(long, 200, 40)
    assert all(len(p) <= 200 for p in cut) and cut[1].split()[0] in cut[0]  # overlap
    binary = tmp_path / "x.bin"
    binary.write_bytes(b"\0\1\2" * 10)
    with pytest.raises(rag.DocumentError, match="not a text file"):
        rag.read_document(binary)
    # Fitting a known context: tests/test_gui_documents.py (counted by /tokenize, and estimated).
    # Vectors round-trip as float32 blobs; cosine of a vector with itself is 1.
    v = [0.5, -0.25, 1.0]
    assert list(rag.unpack(rag.pack(v))) == v and rag.cosine(v, v) == pytest.approx(1.0)


def anchor_tooltip(view, href: str) -> str:
    """The tooltip (HTML title) of the link `href` in the transcript, as Qt shows it on hover."""
    block = view.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fmt = it.fragment().charFormat()
            if fmt.anchorHref() == href:
                return fmt.toolTip()
            it += 1
        block = block.next()
    return ""


def _has_pypdf() -> bool:
    try:
        import pypdf  # noqa: F401
    except ImportError:
        return False
    return True
