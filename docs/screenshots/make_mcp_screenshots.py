"""The MCP screenshots: mcp-tool-call.png (a tool call card in a chat) and mcp-tools.png (the Tools page).

    QT_QPA_PLATFORM=offscreen .venv/bin/python docs/screenshots/make_mcp_screenshots.py [OUT_DIR]

Real parts: a `wslm serve` on the demo model with tool calling on, the test suite's stdio MCP server
(tests/mcp_servers, written with the official SDK) started by the app, the Chat panel and the Tools page
offscreen. Staged: the model is made to call `add` (a forced tool_choice: the 135M demo model does not pick
tools by itself) and the confirmation is answered "Allow once" by the script. Everything lives in a
temporary config dir."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]


def main(out: Path) -> None:
    cfg = Path(tempfile.mkdtemp(prefix="wslm-mcp-shots-"))
    os.environ["WSLM_CONFIG_DIR"] = str(cfg)
    from test_server_helpers import ServerProcess

    from wslm.gui.app import make_app, process_events_for
    from wslm.gui.chat_panel import ChatPanel
    from wslm.gui.chat_session import ChatSession
    from wslm.gui.chat_store import ChatStore
    from wslm.gui.mcp_chat import connect_chat
    from wslm.gui.mcp_config import McpConfig, ServerConfig
    from wslm.gui.mcp_page import McpPage
    from wslm.gui.mcp_service import McpService
    from wslm.gui.settings import Settings

    make_app()
    servers = ROOT / "tests" / "mcp_servers"
    McpConfig(servers={
        "calculator": ServerConfig("calculator", command=sys.executable, args=[str(servers / "stdio_server.py")]),
        "files": ServerConfig("files", command="npx", args=["-y", "@modelcontextprotocol/server-filesystem", "~"],
                              enabled=False),
    }).save()
    service = McpService()
    srv = ServerProcess("demo", "--port", "0", "--max-model-len", "1024", "--kv-cache-memory", "64MiB",
                        "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--uvicorn-log-level", "warning")
    try:
        process_events_for(90, until=lambda: service.status("calculator").state == "ready")
        store = ChatStore(cfg / "chats.sqlite3")
        session = ChatSession(store, {"system_prompt": "", "temperature": 0.0, "max_tokens": 48})
        panel = ChatPanel(session, Settings(chat_use_server=True, system_prompt="", max_tokens=48, temperature=0.0))
        panel.resize(1100, 760)
        panel.show()
        loop = connect_chat(panel, session, panel.view, service, confirm=False)
        loop.confirmation_needed.connect(lambda r: loop.answer(r["row"], "once"))
        panel.set_server(srv.base_url, "demo", "", 1024)
        loop.force_next("add")
        panel.input.setPlainText("What is 17 + 25? Use the add tool.")
        panel.send()
        process_events_for(240, until=lambda: not session.busy and session.messages.rowCount() >= 4)
        tool_row = next(i for i, m in enumerate(session.messages.messages()) if m.role == "tool")
        panel.view.open_cards.add(session.messages.message(tool_row).id)  # the card unfolded
        panel.view.render()
        process_events_for(0.5)
        out.mkdir(parents=True, exist_ok=True)
        panel.grab().save(str(out / "mcp-tool-call.png"))
        print(out / "mcp-tool-call.png")
        page = McpPage(service)
        page.resize(1000, 620)
        page.show()
        page.select("calculator")
        page.tools.topLevelItem(0).setExpanded(True)
        process_events_for(0.5)
        page.grab().save(str(out / "mcp-tools.png"))
        print(out / "mcp-tools.png")
        session.shutdown()
        store.close()
    finally:
        service.close()
        srv.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
