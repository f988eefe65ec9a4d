"""Chat power features on real widgets against a loopback OpenAI-style server that streams reasoning,
tool calls and JSON: the reasoning shown folded and stored (not sent back), tool calls and JSON shown
readably, regenerated replies kept as versions (‹ 1/2 ›), editing a sent message, export (Markdown, JSON)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("PySide6")

from PySide6.QtCore import QUrl  # noqa: E402

from wslm.gui.chat_panel import ChatPanel  # noqa: E402
from wslm.gui.chat_session import ChatSession  # noqa: E402
from wslm.gui.chat_store import ChatStore  # noqa: E402
from wslm.gui.settings import Settings  # noqa: E402


class Scripted(BaseHTTPRequestHandler):
    """Streams delta.reasoning_content, then content "Answer N" (N counts requests); a prompt with "weather"
    gets a tool call in pieces, one with "json" a JSON object."""

    requests: list[dict] = []

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        last = body["messages"][-1]["content"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        deltas = [{"reasoning_content": "Let me "}, {"reasoning_content": "think."}]
        if "weather" in last:
            deltas += [{"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                        "function": {"name": "get_weather", "arguments": ""}}]},
                       {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
                       {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}]
        elif "json" in last:
            deltas += [{"content": '{"name": "Ada", '}, {"content": '"age": 36}'}]
        else:
            deltas += [{"content": "Answer "}, {"content": str(len(type(self).requests))}]
        for d in deltas:
            chunk = {"model": body["model"], "choices": [{"index": 0, "delta": d, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n')
        self.wfile.flush()


@pytest.fixture
def panel(qtbot, tmp_path):
    Scripted.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    store = ChatStore(tmp_path / "chats.sqlite3")
    session = ChatSession(store, {"system_prompt": ""})
    settings = Settings(chat_use_server=False, chat_base_url=f"http://127.0.0.1:{server.server_address[1]}/v1",
                        chat_model="thinker", system_prompt="")
    p = ChatPanel(session, settings)
    qtbot.addWidget(p)
    p.show()
    yield p
    session.shutdown()
    server.shutdown()
    server.server_close()
    store.close()


def ask(panel, qtbot, text: str) -> None:
    panel.input.setPlainText(text)
    with qtbot.waitSignal(panel.session.reply_finished, timeout=10_000):
        panel.send()


def test_reasoning_tools_and_json_are_shown_readably(panel, qtbot, tmp_path):
    ask(panel, qtbot, "hello")
    reply = panel.session.messages.messages()[-1]
    assert reply.content == "Answer 1" and reply.stats["reasoning"] == "Let me think."
    assert reply.stats["reasoning_s"] >= 0 and reply.stats["model"] == "thinker"
    panel.view.render()
    text = panel.view.toPlainText()
    assert "Thought for" in text and "Let me think." not in text  # folded
    panel.view._on_link(QUrl("think:1"))
    assert "Let me think." in panel.view.toPlainText()  # click to open
    # Stored with the message; never sent back to the model.
    assert panel.session.store.messages(reply.conversation_id)[-1].stats["reasoning"] == "Let me think."
    ask(panel, qtbot, "what is the weather")
    assert all("think" not in m["content"] for m in Scripted.requests[-1]["messages"])
    call = panel.session.messages.messages()[-1].stats["tool_calls"][0]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
    panel.view.render()
    assert '🔧 get_weather({"city": "Paris"})' in panel.view.toPlainText()
    ask(panel, qtbot, "give json")
    panel.view.render()
    assert '"name": "Ada",\n' in panel.view.toPlainText()  # pretty-printed

    # Export: Markdown with the reasoning folded in <details>, JSON with OpenAI-style messages.
    conv_id = panel.session.messages.conversation_id
    panel.export_chat(conv_id, str(tmp_path / "chat.md"))
    panel.export_chat(conv_id, str(tmp_path / "chat.json"))
    md = (tmp_path / "chat.md").read_text(encoding="utf-8")
    assert "# hello" in md and "<summary>Thought for" in md and "Answer 1" in md and "get_weather" in md
    data = json.loads((tmp_path / "chat.json").read_text(encoding="utf-8"))
    roles = [m["role"] for m in data["messages"]]
    assert roles == ["user", "assistant"] * 3 and data["messages"][1]["reasoning_content"] == "Let me think."
    assert data["messages"][3]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_regenerate_keeps_versions_and_edit_reruns(panel, qtbot):
    session = panel.session
    ask(panel, qtbot, "hello")
    with qtbot.waitSignal(session.reply_finished, timeout=10_000):
        panel._regenerate(1)
    reply = session.messages.messages()[1]
    assert reply.content == "Answer 2" and reply.stats["version"] == 1
    assert [v["content"] for v in reply.stats["versions"]] == ["Answer 1", "Answer 2"]
    assert reply.stats["versions"][0]["stats"].get("reasoning") == "Let me think."  # stats kept per version
    panel.view.render()
    assert "2/2" in panel.view.toPlainText()
    panel.view._on_link(QUrl("ver:1:0"))  # ‹
    panel.view.render()
    assert session.messages.messages()[1].content == "Answer 1" and "1/2" in panel.view.toPlainText()
    ask(panel, qtbot, "and then")
    assert Scripted.requests[-1]["messages"][1]["content"] == "Answer 1"  # the version shown goes on
    # The flip survives a reload from SQLite.
    saved = session.store.messages(session.messages.conversation_id)[1]
    assert saved.content == "Answer 1" and saved.stats["version"] == 0

    panel.view._on_link(QUrl("edit:0"))
    assert panel.input.toPlainText() == "hello" and panel.editing_row == 0
    panel.input.setPlainText("hello, edited")
    with qtbot.waitSignal(session.reply_finished, timeout=10_000):
        panel.send()
    msgs = session.messages.messages()
    assert [(m.role, m.content) for m in msgs] == [("user", "hello, edited"), ("assistant", "Answer 4")]
    assert panel.editing_row == -1 and panel.input.toPlainText() == ""
