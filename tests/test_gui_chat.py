"""Chat: the SSE stream worker against a tiny OpenAI-style server on loopback, errors, and the SQLite store."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("PySide6")

from PySide6.QtCore import QTimer  # noqa: E402

from wslm.gui.chat_session import ChatSession  # noqa: E402
from wslm.gui.chat_store import ChatStore  # noqa: E402
from wslm.gui.markdown import render_markdown  # noqa: E402

WORDS = ["Hello", " 世界", ",", " this", " is", " a", " streamed", " reply", "."]


class FakeOpenAI(BaseHTTPRequestHandler):
    """Streams WORDS as chat.completion.chunk events, `delay` seconds apart; 401 without the key."""

    delay = 0.05
    first_delay = 0.0  # a long prefill
    repeat = 1
    api_key = "sk-test"
    requests: list[dict] = []
    disconnected = threading.Event()

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        if self.headers.get("Authorization") != f"Bearer {self.api_key}":
            self._json(401, {"error": {"message": "Invalid API key", "type": "invalid_request_error"}})
            return
        if any("TOO LONG" in m["content"] for m in body["messages"]):
            self._json(400, {"error": {"message": "This model's maximum context length is 2048 tokens."}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.flush()
        try:
            time.sleep(self.first_delay)
            for word in WORDS * self.repeat:
                chunk = {"id": "c1", "object": "chat.completion.chunk", "model": body["model"],
                         "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode())
                self.wfile.flush()
                time.sleep(self.delay)
            end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                   "usage": {"completion_tokens": len(WORDS) * self.repeat}}
            self.wfile.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            type(self).disconnected.set()

    def _json(self, status: int, data: dict) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


@pytest.fixture
def fake_server():
    FakeOpenAI.requests = []
    FakeOpenAI.delay = 0.05
    FakeOpenAI.repeat = 1
    FakeOpenAI.first_delay = 0.0
    FakeOpenAI.disconnected = threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.fixture
def session(tmp_path, qtbot):
    store = ChatStore(tmp_path / "chats.sqlite3")
    s = ChatSession(store, {"system_prompt": "Be brief.", "temperature": 0.2, "top_p": 0.9, "max_tokens": 64})
    yield s
    s.shutdown()
    store.close()


def test_stream_reply_and_event_loop_keeps_turning(session, fake_server, qtbot):
    session.set_endpoint(fake_server, "sk-test", "demo")
    ticks = []
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(time.monotonic()))
    timer.start(10)
    t0 = time.monotonic()
    with qtbot.waitSignal(session.reply_finished, timeout=10000) as blocker:
        assert session.send("Say hello")
    elapsed = time.monotonic() - t0
    timer.stop()
    stats = blocker.args[0]
    msgs = session.messages.messages()
    assert [m.role for m in msgs] == ["user", "assistant"]
    assert msgs[1].content == "".join(WORDS)
    assert stats["tokens"] == len(WORDS) and stats["ttft_s"] is not None and stats["tokens_per_s"] > 0
    # The stream took ~0.45 s on an idle machine; a GUI thread that was never blocked ticked most of the 10 ms
    # slots, and no gap between ticks came near the stream's length (relative to it: on a loaded 2-core CI
    # machine the OS alone can hold the process off the CPU for a few hundred ms).
    assert len(ticks) >= 0.3 * elapsed / 0.010
    assert max(b - a for a, b in zip(ticks, ticks[1:], strict=False)) < 0.6 * elapsed
    sent = FakeOpenAI.requests[-1]
    assert sent["stream"] is True and sent["temperature"] == 0.2 and sent["max_tokens"] == 64
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
    # The title comes from the first message.
    assert session.conversations.data(session.conversations.index(0)) == "Say hello"


def test_stop_ends_stream_and_closes_connection(session, fake_server, qtbot):
    FakeOpenAI.delay = 0.1
    FakeOpenAI.repeat = 50
    session.set_endpoint(fake_server, "sk-test", "demo")
    with qtbot.waitSignal(session.first_token, timeout=10000):
        session.send("Talk for a long time")
    qtbot.wait(300)
    with qtbot.waitSignal(session.busy_changed, timeout=2000):
        session.stop()
    partial = session.messages.messages()[-1]
    assert 0 < len(partial.content) < len("".join(WORDS * 50))
    assert partial.stats.get("stopped") is True
    assert FakeOpenAI.disconnected.wait(5), "the server never saw the connection close"
    # The partial reply is in the database too.
    again = session.store.messages(session.messages.conversation_id)
    assert again[-1].content == partial.content


def test_branches_wait_while_a_reply_streams(session, fake_server, qtbot):
    session.set_endpoint(fake_server, "sk-test", "demo")
    with qtbot.waitSignal(session.reply_finished, timeout=10000):
        session.send("one")
    FakeOpenAI.delay = 0.1
    FakeOpenAI.repeat = 50
    with qtbot.waitSignal(session.first_token, timeout=10000):
        assert session.regenerate(1)
    # Rows would change under the reply: no flip, delete or edit until it ends.
    assert not session.show_branch(1, 0) and not session.delete_message(0)
    assert not session.edit_and_rerun(0, "two") and session.continue_reply()
    session.stop()
    cut = session.messages.messages()[1]
    assert cut.stats.get("stopped") and len(cut.siblings) == 2
    assert session.show_branch(1, 0) and session.messages.messages()[1].content == "".join(WORDS)
    assert session.show_branch(1, 1) and session.messages.messages()[1].content == cut.content


def test_stop_before_the_first_token_returns_at_once(session, fake_server, qtbot):
    FakeOpenAI.first_delay = 5.0  # the server is busy with a long prompt
    session.set_endpoint(fake_server, "sk-test", "demo")
    session.send("A very long prompt")
    qtbot.wait(400)
    worker = session._worker
    assert worker is not None and worker.isRunning()
    session.stop()
    assert not session.busy
    # The blocked read was woken (not left for 5 s) and the worker reaped.
    qtbot.waitUntil(lambda: worker not in session._retired, timeout=1500)
    assert session.messages.messages()[-1].stats.get("stopped") is True


def test_errors_shown_in_place_and_input_kept(session, fake_server, qtbot):
    session.set_endpoint(fake_server, "wrong-key", "demo")
    with qtbot.waitSignal(session.reply_failed, timeout=10000) as blocker:
        session.send("Question one")
    kind, message = blocker.args
    assert kind == "auth" and "API key" in message
    msgs = session.messages.messages()
    assert msgs[0].content == "Question one" and msgs[1].error  # the question survives
    # Fix the key and regenerate: the same question gets its answer.
    session.set_endpoint(fake_server, "sk-test", "demo")
    with qtbot.waitSignal(session.reply_finished, timeout=10000):
        assert session.regenerate()
    msgs = session.messages.messages()
    assert [m.role for m in msgs] == ["user", "assistant"] and msgs[1].content and not msgs[1].error
    with qtbot.waitSignal(session.reply_failed, timeout=10000) as blocker:
        session.send("TOO LONG " * 3)
    assert blocker.args[0] == "context" and "context" in blocker.args[1]


def test_server_down_message(session, qtbot):
    session.set_endpoint("http://127.0.0.1:9", "", "demo")
    with qtbot.waitSignal(session.reply_failed, timeout=10000) as blocker:
        session.send("anyone there?")
    assert blocker.args[0] == "down" and "Server panel" in blocker.args[1]


def test_conversations_survive_restart(tmp_path, qtbot):
    path = tmp_path / "chats.sqlite3"
    store = ChatStore(path)
    s = ChatSession(store)
    conv = s.new_conversation()
    s.messages.append("user", "remember me 你好")
    s.conversations.rename(s.conversations.row_of(conv.id), "Kept")
    other = s.new_conversation()
    s.delete_conversation(s.conversations.row_of(other.id))
    store.close()
    store2 = ChatStore(path)
    s2 = ChatSession(store2)
    assert [c.title for c in store2.list_conversations()] == ["Kept"]
    s2.open(conv.id)
    assert s2.messages.messages()[0].content == "remember me 你好"
    s2.conversations.set_search("你好")
    assert s2.conversations.rowCount() == 1
    s2.conversations.set_search("nothing like this")
    assert s2.conversations.rowCount() == 0
    store2.close()


def test_markdown_code_blocks_and_cjk():
    out = render_markdown("# 标题\n\n中文**加粗**文字 and `x<y`\n\n```python\nprint('<hi>')\n```\n- 一\n- two_words_here")
    plain = re.sub(r"<span[^>]*>|</span>", "", out)  # code blocks are syntax-highlighted (spans)
    assert "<pre" in out and "print(&#x27;&lt;hi&gt;&#x27;)" in plain and "python" in out
    assert "<b>加粗</b>" in out and "中文" in out and "x&lt;y" in out
    assert "two_words_here" in out  # no italics inside identifiers
    streaming = render_markdown("Here:\n```js\nlet a = 1")
    assert "<pre" in streaming and "let a = 1" in re.sub(r"<span[^>]*>|</span>", "", streaming)
    assert "<script>" not in render_markdown("<script>alert(1)</script>")


def test_chat_panel_send_copy_regenerate_rename_delete(qtbot, tmp_path, fake_server):
    from PySide6.QtCore import Qt, QUrl
    from PySide6.QtGui import QGuiApplication

    from wslm.gui.chat_panel import ChatPanel
    from wslm.gui.settings import Settings

    store = ChatStore(tmp_path / "chats.sqlite3")
    settings = Settings(chat_use_server=False, chat_base_url=fake_server, chat_api_key="sk-test", chat_model="demo")
    session = ChatSession(store, {"system_prompt": settings.system_prompt})
    panel = ChatPanel(session, settings)
    qtbot.addWidget(panel)
    panel.resize(1100, 700)
    panel.show()
    assert session.base_url == fake_server and session.model == "demo"
    assert fake_server in panel.connection_label.text()

    panel.input.setPlainText("First question")
    with qtbot.waitSignal(session.reply_finished, timeout=10000):
        qtbot.keyClick(panel.input, Qt.Key.Key_Return)  # Enter sends
    assert panel.input.toPlainText() == ""
    qtbot.waitUntil(lambda: "Regenerate" in panel.view.toPlainText(), timeout=3000)
    assert "".join(WORDS) in panel.view.toPlainText() and "tok/s" in panel.view.toPlainText()

    panel.view.anchorClicked.emit(QUrl("copy:1"))
    assert QGuiApplication.clipboard().text() == "".join(WORDS)
    session.messages.append("assistant", "Two blocks:\n```sh\necho one\n```\nand\n```py\nprint(2)\n```")
    panel.view.render()
    assert "copycode:2:1" in panel.view.toHtml()
    panel.view.anchorClicked.emit(QUrl("copycode:2:1"))
    assert QGuiApplication.clipboard().text() == "print(2)"
    session.messages.remove_from(2)
    FakeOpenAI.requests.clear()
    with qtbot.waitSignal(session.reply_finished, timeout=10000):
        panel.view.anchorClicked.emit(QUrl("regen:1"))
    assert len(session.messages.messages()) == 2 and len(FakeOpenAI.requests) == 1
    assert FakeOpenAI.requests[0]["messages"][-1] == {"role": "user", "content": "First question"}

    # Shift+Enter is a new line, not a send.
    panel.input.setPlainText("line one")
    qtbot.keyClick(panel.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    assert "\n" in panel.input.toPlainText() and not session.busy

    model = session.conversations
    assert model.setData(model.index(0), "Renamed chat")
    assert store.list_conversations()[0].title == "Renamed chat"
    panel.new_chat()
    assert model.rowCount() == 2 and session.messages.rowCount() == 0
    panel.temperature.setValue(1.3)
    assert store.get_conversation(session.messages.conversation_id).temperature == pytest.approx(1.3)
    panel._delete(0, confirm=False)
    assert model.rowCount() == 1 and session.messages.conversation_id == 0
    panel.search.setText("Renamed")
    assert model.rowCount() == 1
    panel.search.setText("zzz")
    assert model.rowCount() == 0
    panel.close()
    store.close()


def test_no_endpoint_keeps_the_text(qtbot, tmp_path):
    from wslm.gui.chat_panel import ChatPanel
    from wslm.gui.settings import Settings

    store = ChatStore(tmp_path / "chats.sqlite3")
    session = ChatSession(store)
    panel = ChatPanel(session, Settings(chat_use_server=True))
    qtbot.addWidget(panel)
    panel.input.setPlainText("keep me")
    panel.send()
    assert panel.input.toPlainText() == "keep me" and not panel.error_label.isHidden()
    assert "Server panel" in panel.error_label.text() and session.messages.rowCount() == 0
    store.close()


def test_log_model_is_capped_and_searchable(qtbot):
    from wslm.gui.log_model import LogFilter, LogModel

    logs = LogModel(max_lines=100)
    for i in range(250):
        logs.add("server" if i % 2 else "models", f"line {i} {'CUDA out of memory' if i == 249 else ''}")
    assert logs.rowCount() == 100 and "line 150" in logs.data(logs.index(0))
    only = LogFilter(logs, "server")
    assert only.rowCount() == 50
    only.setFilterFixedString("cuda OUT")
    assert only.rowCount() == 1
    assert logs.tail("server", 2)[-1].startswith("line 249")
