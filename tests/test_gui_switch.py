"""Model picker and live switch: two installed models (the demo and a tiny random Llama in the models
folder), a real `wslm serve`, a chat reply from the demo, then the Chat panel's picker switches the server to
the tiny model (stop, start, ready) and the next reply comes from it. The Models panel's estimate matches
the KV pool the server reserves; quitting asks while it runs; no server process is left behind."""

from __future__ import annotations

import re
import socket

import psutil
import pytest

pytest.importorskip("PySide6")

from engine_helpers import demo_tokenizer, make_tiny_model  # noqa: E402

from wslm.gui.chat_store import ChatStore  # noqa: E402
from wslm.gui.main_window import MainWindow  # noqa: E402
from wslm.gui.server_controller import CRASHED, READY, STOPPED  # noqa: E402
from wslm.gui.settings import Settings  # noqa: E402

KV_LINE = re.compile(r"KV cache: \d+ blocks of \d+ tokens = (\d+) tokens")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_children() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "serve" in p.cmdline() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def reply(window, qtbot, text: str) -> dict:
    chat = window.chat_panel
    chat.input.setPlainText(text)
    with qtbot.waitSignal(window.session.reply_finished, timeout=120_000) as done:
        chat.send()
    return done.args[0]


@pytest.mark.timeout(400)
def test_switch_model_from_chat(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("WSLM_MODELS_DIR", str(tmp_path / "models"))
    # The demo served as the app serves it: GGUF weights kept quantized, dtype=auto (bf16 on CPUs with
    # avx512_bf16/AMX), not the dequantized form the parity tests load.
    monkeypatch.setenv("WSLM_GGUF_DEQUANTIZE", "0")
    make_tiny_model(tmp_path / "models" / "tiny-llama", "llama", demo_tokenizer())
    settings = Settings(first_run_done=True, port=free_port(), model="demo", max_model_len=512,
                        serve_extra_args="--max-num-seqs 4", max_tokens=6, system_prompt="")
    store = ChatStore(tmp_path / "chats.sqlite3")
    window = MainWindow(settings, store, watch=False)
    qtbot.addWidget(window)
    window.show()
    chat, server = window.chat_panel, window.server
    qtbot.waitUntil(lambda: "tiny-llama" in window.models.table.ids(), timeout=90_000)
    # Both pickers list the installed models (not free text), by the names users know.
    assert window.server_panel.model.findData("tiny-llama") >= 0 and not window.server_panel.model.isEditable()
    assert chat.model_combo.findData("demo") >= 0 and chat.model_combo.findData("tiny-llama") >= 0
    assert chat.model_combo.itemText(chat.model_combo.findData("demo")).endswith(".gguf")

    window.server_panel.start()
    qtbot.waitUntil(lambda: server.state in (READY, CRASHED), timeout=180_000)
    assert server.state == READY, window.logs.text()[-3000:]
    # The Models panel's estimate counts the KV pool this server reserved (same context, same function).
    demo = next(m for m in window.models.table.models if m["id"] == "demo")
    tokens = int(KV_LINE.search(window.logs.text()).group(1))
    reserved = tokens * demo["kv_bytes_per_token"]
    assert abs(demo["kv_cache_bytes"] - reserved) <= 0.1 * reserved
    assert demo["memory_estimate_bytes"] >= demo["weights_memory_bytes"] + reserved
    first = reply(window, qtbot, "Say hi.")
    assert first["model"] == "demo" and first["tokens"] > 0
    demo_pid = int(server.ready_event["pid"])

    states = []
    server.state_changed.connect(lambda s, _d: states.append(s))
    chat.choose_model("tiny-llama")
    assert "Switching to tiny-llama" in chat.switch_note.text() and not chat.switch_note.isHidden()
    chat.input.setPlainText("too early")
    chat.send()
    assert chat.error_label.isVisible() and chat.input.toPlainText() == "too early"  # kept, not sent
    qtbot.waitUntil(lambda: server.state == READY and server.config.model == "tiny-llama", timeout=180_000)
    assert states[:2] == ["stopping", "stopped"] and "loading" in states and states[-1] == READY
    assert not psutil.pid_exists(demo_pid) or psutil.Process(demo_pid).status() == psutil.STATUS_ZOMBIE
    assert window.server_panel.model_id() == "tiny-llama" and chat.switch_note.isHidden()
    assert chat.model_combo.currentData() == "tiny-llama" and "tiny-llama" in chat.connection_label.toolTip()
    second = reply(window, qtbot, "Hello again")
    assert second["model"] == "tiny-llama"
    assert [m.role for m in window.session.messages.messages()] == ["user", "assistant"] * 2

    # Closing with the server running asks; "Cancel" keeps both; "Yes" stops it and leaves nothing behind.
    window.confirm_close = lambda: False
    assert not window.close() and server.state == READY
    window.confirm_close = lambda: True
    assert window.close()
    assert server.state == STOPPED and not serve_children()
    store.close()
