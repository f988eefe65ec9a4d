"""MCP in chat (issue 34) against real MCP servers written with the official SDK (tests/mcp_servers: a stdio one
the app starts itself, a streamable-HTTP one on a free loopback port) and a real `wslm serve` on the demo
model: the tools listed on the Tools page, the model driven to call one (a forced tool_choice: the 135M demo
model does not pick tools by itself), the confirmation asked and answered, the call made, its card in the
transcript and its result sent back to the model; a timeout and a server dying mid-call give cards and the
chat goes on; mcp.json round-trips (Claude Desktop's and LM Studio's files import as they are)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("mcp")

from PySide6.QtCore import Qt, QUrl  # noqa: E402
from PySide6.QtGui import QGuiApplication  # noqa: E402

from wslm.gui import stream_worker  # noqa: E402
from wslm.gui.chat_panel import ChatPanel  # noqa: E402
from wslm.gui.chat_session import ChatSession  # noqa: E402
from wslm.gui.chat_store import ChatStore  # noqa: E402
from wslm.gui.mcp_chat import connect_chat  # noqa: E402
from wslm.gui.mcp_client import ERROR, READY  # noqa: E402
from wslm.gui.mcp_config import McpConfig, McpConfigError, ServerConfig  # noqa: E402
from wslm.gui.mcp_confirm import ToolConfirmDialog  # noqa: E402
from wslm.gui.mcp_page import McpPage, ServerDialog, join_command, split_command  # noqa: E402
from wslm.gui.mcp_service import McpService  # noqa: E402
from wslm.gui.settings import Settings  # noqa: E402
from wslm.gui.tool_loop import ToolLoop  # noqa: E402

SERVERS = Path(__file__).parent / "mcp_servers"
HTTP_TIMEOUT_S = 2.0  # the HTTP server's call timeout in mcp.json (its `slow` tool waits longer)


@pytest.fixture(scope="module")
def http_mcp():
    """The streamable-HTTP MCP server: its URL (the last test crashes it)."""
    proc = subprocess.Popen([sys.executable, str(SERVERS / "http_server.py")], stdout=subprocess.PIPE, text=True)
    try:
        port = json.loads(proc.stdout.readline())["port"]
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="module")
def mcp_service(http_mcp, tmp_path_factory, qapp):
    """One McpService for the module: "calc" (stdio) and "web" (HTTP), both connected."""
    path = tmp_path_factory.mktemp("mcpcfg") / "mcp.json"
    McpConfig(servers={
        "calc": ServerConfig("calc", command=sys.executable, args=[str(SERVERS / "stdio_server.py")]),
        "web": ServerConfig("web", url=http_mcp, headers={"X-Test": "1"}, timeout_s=HTTP_TIMEOUT_S),
    }).save(path)
    service = McpService(path)
    deadline = time.monotonic() + 90
    while any(service.status(n).state != READY for n in ("calc", "web")):
        qapp.processEvents()
        assert time.monotonic() < deadline, {n: service.status(n) for n in ("calc", "web")}
        time.sleep(0.05)
    yield service
    service.close()


@pytest.fixture(scope="module")
def demo_server():
    """A real `wslm serve` on the demo model, with tool calling on (hermes: tool_choice "auto" works)."""
    from test_server_helpers import ServerProcess

    srv = ServerProcess("demo", "--port", "0", "--max-model-len", "1024", "--kv-cache-memory", "64MiB",
                        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                        "--uvicorn-log-level", "warning", "--shutdown-timeout", "0")
    yield srv
    srv.stop()


@pytest.fixture
def sent_bodies(monkeypatch):
    """Every chat request body the GUI sends (recorded on its way out)."""
    bodies: list[dict] = []
    original = stream_worker.ChatRequest.body

    def body(self):
        out = original(self)
        if threading.current_thread() is not threading.main_thread():  # sent (previews are built on the GUI thread)
            bodies.append(json.loads(json.dumps(out)))
        return out

    monkeypatch.setattr(stream_worker.ChatRequest, "body", body)
    return bodies


def make_panel(qtbot, tmp_path, service, server) -> ChatPanel:
    store = ChatStore(tmp_path / "chats.sqlite3")
    session = ChatSession(store, {"system_prompt": "", "temperature": 0.0, "max_tokens": 40})
    panel = ChatPanel(session, Settings(chat_use_server=True, system_prompt="", max_tokens=40, temperature=0.0))
    qtbot.addWidget(panel)
    panel.resize(1000, 760)
    panel.show()
    connect_chat(panel, session, panel.view, service)
    panel.set_server(server.base_url, "demo", "", 1024)
    return panel


def close(panel: ChatPanel) -> None:
    panel.session.shutdown()
    panel.attachments.close()
    panel.session.store.close()


def transcript(panel) -> str:
    panel.view.render()  # not waiting for the throttled re-render
    return panel.view.toPlainText()


def open_dialogs(panel) -> list[ToolConfirmDialog]:
    return [d for d in panel.findChildren(ToolConfirmDialog) if d.isVisible()]


def wait_idle(qtbot, session, timeout=180_000) -> None:
    """The chat has finished its whole turn: no reply streaming, no tool call open, the last one a reply."""
    def idle():
        last = session.messages.message(session.messages.rowCount() - 1)
        return not session.busy and last is not None and last.role == "assistant" and "streaming" not in last.stats
    qtbot.waitUntil(idle, timeout=timeout)


def test_tools_page_lists_servers_and_tools(qtbot, mcp_service):
    page = McpPage(mcp_service)
    qtbot.addWidget(page)
    page.resize(900, 600)
    page.show()
    texts = [page.list.item(i).text() for i in range(page.list.count())]
    assert texts == ["calc  —  ready · 3 tools", "web  —  ready · 3 tools"]
    page.select("calc")
    assert page.tool_names() == ["add", "slow", "crash"]
    add = page.tools.topLevelItem(0)
    assert add.text(1) == "Add two integers and return their sum."
    schema = json.loads(add.child(0).text(1))
    assert schema["properties"]["a"]["type"] == "integer" and schema["required"] == ["a", "b"]
    assert "ready" in page.detail_status.text() and "wslm-test-stdio" in page.detail_status.text()
    # The same tool names on two servers: each is offered with its server's name in front.
    names = sorted(t["function"]["name"] for t in mcp_service.openai_tools())
    assert names == ["calc__add", "calc__crash", "calc__slow", "web__add", "web__crash", "web__slow"]

    # Add through the dialog: a missing command is refused with the reason; a good one is saved and listed.
    dialog = ServerDialog(None, {"calc", "web"}, page)
    dialog.name.setText("calc")
    dialog._accept()
    assert "already a server named 'calc'" in dialog.error.text()
    dialog.name.setText("notes")
    dialog._accept()
    assert "neither a command" in dialog.error.text()
    dialog.command.setText("/nonexistent/mcp-server --flag 'two words'")
    dialog.env.setPlainText("TOKEN=abc")
    dialog._accept()
    assert dialog.result() == ServerDialog.DialogCode.Accepted
    new = dialog.server()
    assert (new.command, new.args, new.env) == ("/nonexistent/mcp-server", ["--flag", "two words"], {"TOKEN": "abc"})
    assert split_command(r'"C:\Program Files\nodejs\npx.cmd" -y pkg C:\Users\me') == [
        r"C:\Program Files\nodejs\npx.cmd", "-y", "pkg", r"C:\Users\me"]
    assert split_command(join_command(["a b", "c", ""])) == ["a b", "c", ""]
    new.enabled = False  # saved disabled: nothing starts
    mcp_service.put(new)
    saved = json.loads(mcp_service.config.path.read_text())["mcpServers"]["notes"]
    assert saved == {"command": "/nonexistent/mcp-server", "args": ["--flag", "two words"], "env": {"TOKEN": "abc"},
                     "disabled": True}
    assert page.list.item(2).text() == "notes  —  disabled"
    # Enabled from its checkbox: the command does not exist, which its status says.
    page.list.item(2).setCheckState(Qt.CheckState.Checked)
    qtbot.waitUntil(lambda: mcp_service.status("notes").state == ERROR, timeout=30_000)
    page.select("notes")
    assert "No such file" in page.error_box.toPlainText() or "not found" in page.error_box.toPlainText()
    assert "disabled" not in json.loads(mcp_service.config.path.read_text())["mcpServers"]["notes"]
    page.remove_server(ask=False)
    assert "notes" not in json.loads(mcp_service.config.path.read_text())["mcpServers"]
    # Edit: the dialog shows the server as saved; a new timeout needs no reconnect (the tools stay listed).
    edit = ServerDialog(mcp_service.server("web"), {"calc", "web"}, page)
    assert edit.kind.currentData() == "http" and edit.url.text() == mcp_service.server("web").url
    assert edit.headers.toPlainText() == "X-Test: 1" and edit.timeout.value() == HTTP_TIMEOUT_S
    edit.timeout.setValue(HTTP_TIMEOUT_S)  # unchanged (the timeout test relies on it); the rest re-saved
    edit._accept()
    mcp_service.put(edit.server(), old_name="web")
    assert mcp_service.status("web").state == READY and mcp_service.server("web").headers == {"X-Test": "1"}
    assert [page.list.item(i).text().split()[0] for i in range(page.list.count())] == ["calc", "web"]


def test_model_calls_an_mcp_tool_confirmed_and_the_result_goes_back(qtbot, tmp_path, mcp_service, demo_server,
                                                                    sent_bodies):
    panel = make_panel(qtbot, tmp_path, mcp_service, demo_server)
    session = panel.session
    try:
        asked: list[dict] = []
        session.tool_loop.confirmation_needed.connect(asked.append)
        session.tool_loop.force_next("calc__add")
        preview = session.request_preview()  # the developer view's request: the tools, the forced choice
        assert preview["tool_choice"]["function"]["name"] == "calc__add" and len(preview["tools"]) == 6
        panel.input.setPlainText("What is 2 + 3? Use the tool.")
        panel.send()
        qtbot.waitUntil(lambda: bool(open_dialogs(panel)), timeout=180_000)
        dialog = open_dialogs(panel)[0]
        assert asked and asked[0]["tool"] == "add" and asked[0]["server"] == "calc"
        args = asked[0]["arguments"]
        assert set(args) == {"a", "b"} and all(isinstance(v, int) for v in args.values())
        # Before the answer: nothing was called, the card asks, the chat is busy (Send waits).
        tool_msg = session.messages.messages()[-1]
        assert tool_msg.role == "tool" and tool_msg.stats["state"] == "confirm" and session.busy
        assert "wants to call" in transcript(panel) and "Allow once" in transcript(panel)
        # Any later call the model makes by itself is denied (the test answers only the first).
        session.tool_loop.confirmation_needed.connect(lambda r: session.tool_loop.answer(r["row"], "deny"))
        dialog.once_button.click()
        wait_idle(qtbot, session)
        msgs = session.messages.messages()
        assert [m.role for m in msgs[:4]] == ["user", "assistant", "tool", "assistant"]
        call = msgs[1].stats["tool_calls"][0]
        assert call["name"] == "calc__add" and json.loads(call["arguments"]) == args
        assert msgs[2].stats["state"] == "done" and msgs[2].content == str(args["a"] + args["b"])
        assert not msgs[3].error
        # The first request offered the tools and forced the one named; the next one sent the call and its
        # result back (and let the model answer freely).
        first, second = sent_bodies[0], sent_bodies[1]
        assert first["tool_choice"] == {"type": "function", "function": {"name": "calc__add"}}
        assert {t["function"]["name"] for t in first["tools"]} >= {"calc__add", "web__slow"}
        assert second["tool_choice"] == "auto"
        assistant, tool = second["messages"][-2:]
        assert assistant["role"] == "assistant" and assistant["tool_calls"][0]["id"] == call["id"]
        assert tool == {"role": "tool", "tool_call_id": call["id"], "content": str(args["a"] + args["b"])}
        # The transcript shows the card (name, server, result), folded; a click unfolds the arguments.
        text = transcript(panel)
        assert "called add" in text and "calc" in text and f"→ {args['a'] + args['b']}" in text
        panel.view._on_link(QUrl("toolcard:2"))
        assert "Arguments" in transcript(panel) and '"a"' in transcript(panel)
        panel.view._on_link(QUrl("copycode:2:1"))  # the result's Copy
        assert QGuiApplication.clipboard().text() == str(args["a"] + args["b"])
        # Saved with the chat: reopened, the card and the history are the same.
        again = session.store.messages(session.messages.conversation_id)
        assert again[2].role == "tool" and again[2].stats["state"] == "done"
    finally:
        close(panel)


def test_timeout_and_a_server_dying_mid_call_give_cards_and_the_chat_goes_on(qtbot, tmp_path, mcp_service,
                                                                             demo_server, sent_bodies):
    panel = make_panel(qtbot, tmp_path, mcp_service, demo_server)
    session, loop = panel.session, panel.session.tool_loop
    try:
        with qtbot.waitSignal(session.reply_finished, timeout=180_000):
            session.send("Hi")  # a plain turn first (the tools are offered, the model answers in text)
        assert sent_bodies[-1]["tool_choice"] == "auto"
        # The model's next reply called two tools (staged: the demo model does not pick tools itself): the HTTP
        # server's slow tool, past its timeout, and its crash tool, which ends the server mid-call.
        conv = session.messages.conversation_id
        session.messages.append("user", "Wait, then crash.")
        row = session.messages.append("assistant", "")
        calls = [{"id": "call_slow1", "name": "web__slow", "arguments": json.dumps({"seconds": 30})},
                 {"id": "call_crash", "name": "web__crash", "arguments": "{}"},
                 {"id": "call_bad", "name": "web__add", "arguments": "{not json"}]
        session.messages.finish(row, {"tool_calls": calls, "finish_reason": "tool_calls"})
        assert loop.handle(conv, row, {"tool_calls": calls}) and session.busy
        # The first is answered from its card's link (the dialog then closes), the second denied once ...
        qtbot.waitUntil(lambda: bool(open_dialogs(panel)), timeout=5000)
        panel.view._on_link(QUrl(f"toolans:{row + 1}:once"))
        qtbot.waitUntil(lambda: loop.pending_row() == row + 2, timeout=30_000)
        assert all(d.request["row"] == row + 2 for d in open_dialogs(panel))  # the first question went away
        timed_out = session.messages.message(row + 1)
        assert timed_out.stats["state"] == "timeout" and "did not answer within 2 s" in timed_out.content
        # ... then allowed: the server dies under the call.
        qtbot.waitUntil(lambda: bool(open_dialogs(panel)), timeout=5000)
        open_dialogs(panel)[0].once_button.click()
        wait_idle(qtbot, session)
        msgs = session.messages.messages()
        crashed, bad, final = msgs[row + 2], msgs[row + 3], msgs[row + 4]
        assert crashed.stats["state"] == "failed" and "stopped during the call" in crashed.content
        assert bad.stats["state"] == "failed" and "not valid JSON" in bad.content
        assert final.role == "assistant" and not final.error
        text = transcript(panel)
        assert "timed out" in text and "failed" in text
        # The model was told each outcome, as tool results.
        results = {m["tool_call_id"]: m["content"] for m in sent_bodies[-1]["messages"] if m["role"] == "tool"}
        assert set(results) == {"call_slow1", "call_crash", "call_bad"} and "within 2 s" in results["call_slow1"]
        # The server is marked failed (the page says why); its tools are no longer offered; the chat goes on.
        assert mcp_service.status("web").state == ERROR and "stopped" in mcp_service.status("web").error
        with qtbot.waitSignal(session.reply_finished, timeout=180_000):
            assert session.send("Thanks")
        assert not any(t["function"]["name"].startswith("web") for t in sent_bodies[-1]["tools"])
        assert {t["function"]["name"] for t in sent_bodies[-1]["tools"]} == {"add", "slow", "crash"}
    finally:
        close(panel)


def test_always_allow_and_deny(qtbot, tmp_path, mcp_service, demo_server, sent_bodies):
    panel = make_panel(qtbot, tmp_path, mcp_service, demo_server)
    session, loop = panel.session, panel.session.tool_loop
    try:
        add, slow = (next(t.function for t in mcp_service.tools() if (t.server, t.name) == ("calc", name))
                     for name in ("add", "slow"))
        conv = session.new_conversation().id
        session.messages.append("user", "Add twice.")
        row = session.messages.append("assistant", "")
        calls = [{"id": f"call_{i}", "name": add, "arguments": json.dumps({"a": i, "b": 1})} for i in (1, 2)]
        calls.append({"id": "call_3", "name": slow, "arguments": json.dumps({"seconds": 0})})
        session.messages.finish(row, {"tool_calls": calls})
        assert loop.handle(conv, row, {"tool_calls": calls})
        qtbot.waitUntil(lambda: bool(open_dialogs(panel)), timeout=5000)
        open_dialogs(panel)[0].always_button.click()  # add: always, from now on (kept in mcp.json)
        # The second add runs without asking; slow is asked about, and denied (Esc closes as Deny).
        qtbot.waitUntil(lambda: loop.pending_row() == row + 3, timeout=30_000)
        assert session.messages.message(row + 2).stats["state"] == "done"
        assert session.messages.message(row + 2).content == "3"
        qtbot.waitUntil(lambda: bool(open_dialogs(panel)), timeout=5000)
        open_dialogs(panel)[0].reject()
        wait_idle(qtbot, session)
        denied = session.messages.message(row + 3)
        assert denied.stats["state"] == "denied" and "denied" in denied.content
        assert json.loads(mcp_service.config.path.read_text())["mcpServers"]["calc"]["alwaysAllow"] == ["add"]
        assert mcp_service.is_always_allowed(add) and not mcp_service.is_always_allowed(slow)
    finally:
        close(panel)


def test_mcp_json_round_trips_and_imports(tmp_path):
    claude = tmp_path / "claude_desktop_config.json"
    claude.write_text(json.dumps({
        "globalShortcut": "Ctrl+Space",
        "mcpServers": {
            "filesystem": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/home/me"]},
            "github": {"command": "docker", "args": ["run", "-i", "ghcr.io/github/github-mcp-server"],
                       "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "x"}, "cwd": "/tmp", "autoApprove": []},
        }}))
    lmstudio = tmp_path / "mcp.json"
    lmstudio.write_text(json.dumps({"mcpServers": {
        "filesystem": {"command": "uvx", "args": ["mcp-server-fs"]},
        "remote": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer t"}, "type": "http"}}}))
    cfg = McpConfig(path=tmp_path / "ours" / "mcp.json")
    assert cfg.import_file(claude) == ["filesystem", "github"]
    assert cfg.import_file(lmstudio) == ["filesystem-2", "remote"]
    cfg.servers["github"].always_allow = ["get_me"]
    cfg.servers["remote"].timeout_s = 5
    cfg.servers["filesystem-2"].enabled = False
    cfg.save()
    back = McpConfig.load(cfg.path)
    assert back.to_json() == cfg.to_json()
    data = json.loads(cfg.path.read_text())["mcpServers"]
    assert data["github"] == {"command": "docker", "args": ["run", "-i", "ghcr.io/github/github-mcp-server"],
                              "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "x"}, "cwd": "/tmp", "autoApprove": [],
                              "alwaysAllow": ["get_me"]}
    assert data["remote"] == {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer t"},
                              "timeout": 5.0}
    assert data["filesystem-2"]["disabled"] is True
    assert [s.name for s in back.enabled()] == ["filesystem", "github", "remote"]
    # An unreadable file is refused with the reason; nothing is overwritten.
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(McpConfigError, match="not valid JSON"):
        McpConfig.load(bad)
    bad.write_text(json.dumps({"mcpServers": {"old": {"url": "http://x/sse", "type": "sse"}}}))
    with pytest.raises(McpConfigError, match="streamable-HTTP"):
        McpConfig.load(bad)
    service = McpService(bad, connect=False)
    try:
        assert "streamable-HTTP" in service.load_error
        service.save()
        assert "sse" in bad.read_text()
    finally:
        service.close()


class NoParserServer(BaseHTTPRequestHandler):
    """A chat server without a tool-call parser: tool_choice "auto" is refused with wslm's own 400; other
    requests get a short streamed reply. Records the bodies."""

    bodies: list[dict] = []

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        if body.get("tools") and body.get("tool_choice", "auto") == "auto":
            raw = json.dumps({"error": {"message": 'This request sends `tools` with tool_choice "auto", which needs '
                                                   "a tool-call parser: start the server with "
                                                   "--enable-auto-tool-choice --tool-call-parser hermes"}}).encode()
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunk = {"choices": [{"index": 0, "delta": {"content": "Hello."}, "finish_reason": "stop"}]}
        self.wfile.write(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())


def test_a_server_without_tool_parser_answers_without_tools_and_stop_ends_a_round(qtbot, tmp_path, mcp_service):
    NoParserServer.bodies = []
    mcp_service.config.servers["calc"].always_allow.clear()  # every call asks (an earlier test allowed add)
    http = ThreadingHTTPServer(("127.0.0.1", 0), NoParserServer)
    http.daemon_threads = True
    threading.Thread(target=http.serve_forever, daemon=True).start()
    store = ChatStore(tmp_path / "chats.sqlite3")
    session = ChatSession(store, {"system_prompt": ""})
    loop = ToolLoop(session, mcp_service)
    session.tool_loop = loop
    try:
        session.set_endpoint(f"http://127.0.0.1:{http.server_address[1]}/v1", "", "chatty")
        with qtbot.waitSignal(session.reply_finished, timeout=10_000):
            assert session.send("Hi")
        # Asked with the tools, refused, asked again without them: one reply, which says why.
        assert [bool(b.get("tools")) for b in NoParserServer.bodies] == [True, False]
        msgs = session.messages.messages()
        assert [m.role for m in msgs] == ["user", "assistant"] and msgs[1].content == "Hello." and not msgs[1].error
        assert "MCP tools not offered" in msgs[1].stats["context_note"]
        with qtbot.waitSignal(session.reply_finished, timeout=10_000):
            assert session.send("Again")
        assert not NoParserServer.bodies[-1].get("tools") and len(NoParserServer.bodies) == 3  # remembered
        # Stop while a call waits for the user: the round ends, nothing is called, the chat is free.
        add = next(t.function for t in mcp_service.tools() if (t.server, t.name) == ("calc", "add"))
        row = session.messages.append("assistant", "")
        calls = [{"id": "c1", "name": add, "arguments": '{"a": 1, "b": 2}'}]
        session.messages.finish(row, {"tool_calls": calls})
        assert loop.handle(session.messages.conversation_id, row, {"tool_calls": calls}) and session.busy
        session.stop()
        assert not session.busy and session.messages.message(row + 1).stats["state"] == "cancelled"
        assert not loop.answer(row + 1, "once")
        # A reply that called a tool while its chat was not open: the call is asked about when it is opened.
        conv = session.messages.conversation_id
        other = session.new_conversation().id
        session.messages.append("user", "Add.")
        arow = session.messages.append("assistant", "")
        session.messages.finish(arow, {"tool_calls": [{"id": "c2", "name": add, "arguments": '{"a": 2, "b": 2}'}]})
        session.open(conv)
        asked: list[dict] = []
        loop.confirmation_needed.connect(asked.append)
        assert not loop.handle(other, arow, session.store.messages(other)[-1].stats) and other in loop.deferred
        session.open(other)
        assert asked and asked[0]["row"] == arow + 1 and asked[0]["arguments"] == {"a": 2, "b": 2} and session.busy
        session.stop()
        session.open(conv)
        # A call left asking when the app ended is marked so when the chat store opens again.
        session.messages.append("tool", "")
        session.messages.finish(row + 2, {"tool_call_id": "c9", "tool": "add", "state": "confirm"})
        store.close()
        again = ChatStore(tmp_path / "chats.sqlite3")
        left = again.messages(conv)[-1]
        assert left.stats["state"] == "cancelled" and "closed before" in left.content
        again.close()
    finally:
        session.shutdown()
        http.shutdown()
        http.server_close()


def test_main_window_wires_mcp(qtbot, tmp_path, monkeypatch):
    from wslm.gui.main_window import MainWindow

    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    McpConfig(servers={"calc": ServerConfig("calc", command=sys.executable, enabled=False,
                                            args=[str(SERVERS / "stdio_server.py")])}).save(
        tmp_path / "config" / "mcp.json")
    store = ChatStore(tmp_path / "chats.sqlite3")
    w = MainWindow(Settings(first_run_done=True), store, watch=False)
    qtbot.addWidget(w)
    try:
        assert w.session.tool_loop is not None and w.session.tool_loop.service is w.mcp
        action = next(a for a in w.menuBar().actions()[0].menu().actions() if a.text().startswith("Tools"))
        action.trigger()
        page = w._mcp_page
        assert page.isVisible() and page.list.item(0).text() == "calc  —  disabled"
    finally:
        w.confirm_close = lambda: True
        w.close()
        store.close()


def test_stdio_server_dying_mid_call_is_an_error_and_reconnect_restarts_it():
    from wslm.gui.mcp_client import McpManager

    manager = McpManager()
    cfg = ServerConfig("calc2", command=sys.executable, args=[str(SERVERS / "stdio_server.py")], timeout_s=30)

    def wait_state(states, timeout=90.0):
        deadline = time.monotonic() + timeout
        while manager.status("calc2").state not in states:
            assert time.monotonic() < deadline, manager.status("calc2")
            time.sleep(0.05)

    try:
        manager.apply([cfg])
        wait_state({READY})
        t0 = time.monotonic()
        result = manager.call("crash", {}).result(30)
        assert result.kind == "failed" and "stopped during the call" in result.text
        assert time.monotonic() - t0 < 10  # not the call's 30 s timeout: the closed pipe ends it
        wait_state({ERROR}, 10)
        assert manager.resolve("add") is None and manager.call("add", {"a": 1, "b": 1}).result(10).kind == "failed"
        manager.reconnect("calc2")
        wait_state({READY})
        assert manager.call("add", {"a": 1, "b": 1}).result(30).text == "2"
    finally:
        manager.close()
