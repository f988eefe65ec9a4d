"""Model picker and switch, on a real `wslm serve` started by the app.

With the model pool (the app starts the server with `--model-pool all`): a chat reply from the demo, then the
Chat panel's picker loads a tiny random Llama from the models folder beside it (POST /v1/models/load, no
restart: same process), the next reply comes from it, switching back needs no load, and a model whose file
is broken shows the server's error while the chat stays with the model it had. The Models panel's estimate
matches the KV pool the server reserves; quitting asks while it runs; no server process is left behind.

Without a pool (an older wslm on the target, which refuses --model-pool): the app starts it without the flag,
and the picker switches by restarting the server (stop, start, ready), as before the pool existed."""

from __future__ import annotations

import re
import shutil
import socket
import sys
import textwrap

import httpx
import psutil
import pytest

pytest.importorskip("PySide6")

import test_gui_chat  # noqa: E402
from test_gui_chat import FakeOpenAI  # noqa: E402
from test_server_model_pool import make_tiny_chat_model  # noqa: E402

from wslm.gui.chat_panel import ChatPanel  # noqa: E402
from wslm.gui.chat_session import ChatSession  # noqa: E402
from wslm.gui.chat_store import ChatStore  # noqa: E402
from wslm.gui.main_window import MainWindow  # noqa: E402
from wslm.gui.model_picker import LoadedRole  # noqa: E402
from wslm.gui.server_controller import CRASHED, LOADING, READY, STOPPED, ServerConfig  # noqa: E402
from wslm.gui.settings import Settings  # noqa: E402
from wslm.wsl_bridge.launcher import Target  # noqa: E402

KV_LINE = re.compile(r"KV cache: \d+ blocks of \d+ tokens = (\d+) tokens")
LOAD_CALL = '"POST /v1/models/load HTTP/1.1" 200'
UNLOAD_CALL = '"POST /v1/models/unload HTTP/1.1" 200'
fake_server = test_gui_chat.fake_server  # the loopback OpenAI-style streamer


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


def alive(pid: int) -> bool:
    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


def reply(window, qtbot, text: str) -> dict:
    chat = window.chat_panel
    chat.input.setPlainText(text)
    with qtbot.waitSignal(window.session.reply_finished, timeout=120_000) as done:
        chat.send()
    return done.args[0]


def badges(combo) -> dict[str, bool]:
    return {combo.itemData(i): bool(combo.itemData(i, LoadedRole)) for i in range(combo.count())}


def open_window(qtbot, tmp_path, monkeypatch, **settings) -> tuple[MainWindow, ChatStore]:
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("WSLM_MODELS_DIR", str(tmp_path / "models"))
    store = ChatStore(tmp_path / "chats.sqlite3")
    window = MainWindow(Settings(first_run_done=True, port=free_port(), max_tokens=6, system_prompt="", **settings),
                        store, watch=False)
    qtbot.addWidget(window)
    window.show()
    return window, store


def close(window, store) -> None:
    # Closing with the server running asks; "Cancel" keeps both; "Yes" stops it and leaves nothing behind.
    window.confirm_close = lambda: False
    assert not window.close() and window.server.state == READY
    window.confirm_close = lambda: True
    assert window.close()
    assert window.server.state == STOPPED and not serve_children()
    store.close()


@pytest.mark.timeout(300)
def test_switch_model_loads_it_beside_the_running_one(qtbot, tmp_path, monkeypatch):
    # The demo served as the app serves it: GGUF weights kept quantized, dtype=auto (bf16 on CPUs with
    # avx512_bf16/AMX), not the dequantized form the parity tests load.
    monkeypatch.setenv("WSLM_GGUF_DEQUANTIZE", "0")
    tiny = make_tiny_chat_model(tmp_path / "models" / "tiny")
    shutil.copytree(tiny, tmp_path / "models" / "broken")  # listed, but its weights are cut short
    (tmp_path / "models" / "broken" / "model.safetensors").write_bytes((tiny / "model.safetensors").read_bytes()[:1000])
    window, store = open_window(qtbot, tmp_path, monkeypatch, model="demo", max_model_len=512,
                                serve_extra_args="--max-num-seqs 4")
    chat, server = window.chat_panel, window.server
    combo = chat.model_combo
    window.server_panel.start()  # while the models are listed (both take seconds)
    # Issue 34 (8): while it comes up, the chip beside the picker says so, as the title bar does.
    assert "starting…" in chat.connection_label.text() and "not running" not in chat.connection_label.text()
    qtbot.waitUntil(lambda: {"tiny", "broken"} <= set(window.models.table.ids()), timeout=90_000)
    qtbot.waitUntil(lambda: server.state in (LOADING, READY, CRASHED), timeout=180_000)
    if server.state == LOADING:  # (the demo loads in seconds: the check runs when the timing lets it)
        assert "loading…" in chat.connection_label.text() and "loading" in window.windowTitle()
    # Both pickers list the installed models (not free text), by the names users know.
    assert window.server_panel.model.findData("tiny") >= 0 and not window.server_panel.model.isEditable()
    assert combo.findData("demo") >= 0 and combo.findData("tiny") >= 0
    assert combo.itemText(combo.findData("demo")).endswith(".gguf")
    qtbot.waitUntil(lambda: server.state in (READY, CRASHED), timeout=180_000)
    assert server.state == READY, window.logs.text()[-3000:]
    assert "--model demo" in window.logs.text() and "--model-pool all" in window.logs.text()  # the command line
    # The Models panel's estimate counts the KV pool this server reserved (same context, same function).
    demo = next(m for m in window.models.table.models if m["id"] == "demo")
    tokens = int(KV_LINE.search(window.logs.text()).group(1))
    reserved = tokens * demo["kv_bytes_per_token"]
    assert abs(demo["kv_cache_bytes"] - reserved) <= 0.1 * reserved
    assert demo["memory_estimate_bytes"] >= demo["weights_memory_bytes"] + reserved
    # The pool as /v1/models says it: every installed model servable, the demo loaded.
    qtbot.waitUntil(lambda: window.pool.pooled, timeout=30_000)
    assert window.pool.state("demo") == "loaded" and window.pool.state("tiny") == "not-loaded"
    assert badges(combo)["demo"] and not badges(combo)["tiny"]
    first = reply(window, qtbot, "Say hi.")
    assert first["model"] == "demo" and first["tokens"] > 0
    pid = int(server.ready_event["pid"])

    # Pick the tiny model: it is loaded beside the demo, no restart.
    states = []
    server.state_changed.connect(lambda s, _d: states.append(s))
    chat.choose_model("tiny")
    assert "Loading tiny" in chat.switch_note.text() and not chat.switch_note.isHidden()
    assert "loading" in chat.connection_label.text() and "tiny (loading…)" in window.status.model.text()
    chat.input.setPlainText("too early")
    chat.send()
    assert chat.error_label.isVisible() and chat.input.toPlainText() == "too early"  # kept, not sent
    qtbot.waitUntil(lambda: chat.server_model == "tiny" and not chat.switching_to, timeout=60_000)
    assert LOAD_CALL in window.logs.text()  # the app asked the server to load it
    assert states == [] and server.state == READY and int(server.ready_event["pid"]) == pid and alive(pid)
    assert chat.switch_note.isHidden() and combo.currentData() == "tiny" and "tiny" in chat.connection_label.toolTip()
    assert window.session.context_len == 512 and window.status.model.text() == "Model: tiny"
    second = reply(window, qtbot, "Hello again")
    assert second["model"] == "tiny"  # the server's response names the model that answered
    # Both are loaded now: both carry the badge (the reply's end read /v1/models again).
    qtbot.waitUntil(lambda: badges(combo)["demo"] and badges(combo)["tiny"], timeout=30_000)

    # Back to the demo: still loaded, its chat goes on, the same process.
    chat.choose_model("demo")
    qtbot.waitUntil(lambda: chat.server_model == "demo" and not chat.switching_to, timeout=30_000)
    assert window.session.context_len == 512 and combo.currentData() == "demo"
    third = reply(window, qtbot, "And you?")
    assert third["model"] == "demo" and third["tokens"] > 0

    # Issue 34 (11): Models → Serve serves the model (a pool load here, as the picker does), not only picks
    # it in the Server panel; then back to the demo with the picker.
    window.show_panel("models")
    window.models_panel.table.selectRow(window.models.table.ids().index("tiny"))
    window.models_panel.serve_button.click()
    qtbot.waitUntil(lambda: chat.server_model == "tiny" and not chat.switching_to, timeout=60_000)
    assert window.server_panel.model_id() == "tiny" and int(server.ready_event["pid"]) == pid
    window.sidebar.select("chat")
    chat.choose_model("demo")
    qtbot.waitUntil(lambda: chat.server_model == "demo" and not chat.switching_to, timeout=30_000)

    # A model that fails to load: the server's error in the chat, the chat stays with the demo.
    chat.choose_model("broken")
    qtbot.waitUntil(lambda: not chat.switching_to, timeout=60_000)
    error = chat.error_label.text()
    assert chat.error_label.isVisible() and "Could not load the model `broken`" in error
    assert "SafetensorError" in error and "The chat stays with SmolLM2-135M-Instruct.Q4_1.gguf." in error
    assert combo.currentData() == "demo" and chat.server_model == "demo" and window.session.model == "demo"
    assert window.session.current().model == "demo" and chat.model_hint.isHidden()
    fourth = reply(window, qtbot, "Still there?")
    assert fourth["model"] == "demo"
    assert states == [] and int(server.ready_event["pid"]) == pid and alive(pid)
    assert [m.role for m in window.session.messages.messages()] == ["user", "assistant"] * 4
    # Issue 34 (11): a setting changed while it serves says it needs a restart.
    kv = window.server_panel.kv_dtype
    kv.setCurrentIndex((kv.currentIndex() + 1) % kv.count())
    assert "Restart to apply" in window.server_panel.detail.text()
    kv.setCurrentIndex((kv.currentIndex() - 1) % kv.count())
    close(window, store)


def server_states(window) -> dict[str, str]:
    """Each model's `state` as the server itself says it (GET /v1/models), not as the app last read it."""
    data = httpx.get(window.server.base_url + "/models", timeout=30).json()["data"]
    return {card["id"]: card["state"] for card in data}


@pytest.mark.timeout(300)
def test_eject_unloads_a_pool_model_and_its_badge_goes(qtbot, tmp_path, monkeypatch):
    for name in ("tiny-a", "tiny-b"):
        make_tiny_chat_model(tmp_path / "models" / name)
    window, store = open_window(qtbot, tmp_path, monkeypatch, model="tiny-a")
    chat, server, pool = window.chat_panel, window.server, window.pool
    combo = chat.model_combo
    window.server_panel.start()  # while the models are listed (both take seconds)
    qtbot.waitUntil(lambda: {"tiny-a", "tiny-b"} <= set(window.models.table.ids()), timeout=90_000)
    qtbot.waitUntil(lambda: server.state in (READY, CRASHED), timeout=180_000)
    assert server.state == READY, window.logs.text()[-3000:]
    qtbot.waitUntil(lambda: pool.pooled, timeout=30_000)
    # Only the model the server started with is loaded, and it stays loaded: nothing to eject.
    assert chat.ejectable() == [] and chat.eject_button.isHidden()
    assert [(a.text(), a.isEnabled()) for a in chat.eject_actions()] == [("No model to eject", False)]

    # tiny-b loaded beside it (the picker), then the chat back on tiny-a: tiny-b stays loaded, ejectable.
    chat.choose_model("tiny-b")
    qtbot.waitUntil(lambda: chat.server_model == "tiny-b" and not chat.switching_to, timeout=60_000)
    chat.choose_model("tiny-a")
    qtbot.waitUntil(lambda: chat.server_model == "tiny-a", timeout=30_000)
    qtbot.waitUntil(lambda: badges(combo)["tiny-a"] and badges(combo)["tiny-b"], timeout=30_000)
    assert chat.ejectable() == ["tiny-b"] and not chat.eject_button.isHidden()
    actions = chat.eject_actions()
    assert [(a.data(), a.text()) for a in actions] == [("tiny-b", "Eject tiny-b")]
    chat.confirm_eject = lambda name: pytest.fail("not the chat's model: nothing to ask")
    said: list[str] = []  # the status bar's toasts go by after 4 s, maybe before the badge below does
    window.status.messageChanged.connect(said.append)
    actions[0].trigger()  # the ⏏ menu's action, as a click runs it
    qtbot.waitUntil(lambda: not badges(combo)["tiny-b"], timeout=60_000)
    assert {k: v for k, v in server_states(window).items() if k.startswith("tiny")} == \
        {"tiny-a": "loaded", "tiny-b": "not-loaded"}
    # the toast comes with the eject's reply, which may land after the pool's poll took the badge away
    qtbot.waitUntil(lambda: any("Ejected tiny-b" in text for text in said), timeout=30_000)
    # The server's access-log line reaches the log view through its stdout pipe, after the reply: wait for it.
    qtbot.waitUntil(lambda: UNLOAD_CALL in window.logs.text(), timeout=30_000)
    assert badges(combo)["tiny-a"] and chat.server_model == "tiny-a" and chat.eject_button.isHidden()

    # The chat's own model: asked first ("Cancel" keeps it), then ejected; the chat goes back to tiny-a.
    chat.choose_model("tiny-b")
    qtbot.waitUntil(lambda: chat.server_model == "tiny-b" and not chat.switching_to, timeout=60_000)
    qtbot.waitUntil(lambda: badges(combo)["tiny-b"] and chat.ejectable() == ["tiny-b"], timeout=30_000)
    asked = []
    chat.confirm_eject = lambda name: asked.append(name) or False
    chat.eject_actions()[0].trigger()
    assert asked == ["tiny-b"] and "this chat's model" in chat.eject_actions()[0].text()
    assert not pool.unloading and server_states(window)["tiny-b"] == "loaded"
    chat.confirm_eject = lambda name: True
    chat.eject_actions()[0].trigger()
    qtbot.waitUntil(lambda: chat.server_model == "tiny-a" and not badges(combo)["tiny-b"], timeout=60_000)
    assert server_states(window)["tiny-b"] == "not-loaded" and combo.currentData() == "tiny-a"
    assert window.session.model == "tiny-a" and window.status.model.text() == "Model: tiny-a"
    assert reply(window, qtbot, "Hi")["model"] == "tiny-a"

    # The server refuses (the model it started with stays loaded): its reason in the chat, nothing changes.
    pid = int(server.ready_event["pid"])
    monkeypatch.setattr(pool, "can_unload", lambda model: True)  # as if the app thought it could
    chat.confirm_eject = lambda name: True
    chat.eject_model("tiny-a")
    qtbot.waitUntil(lambda: chat.error_label.isVisible(), timeout=30_000)
    assert "Could not eject tiny-a: The model served at start (--model) stays loaded" in chat.error_label.text()
    assert server_states(window)["tiny-a"] == "loaded" and badges(combo)["tiny-a"] and chat.server_model == "tiny-a"
    assert server.state == READY and int(server.ready_event["pid"]) == pid and "ejecting tiny-a failed" in window.logs.text()
    close(window, store)


OLD_WSLM = textwrap.dedent("""
    # A wslm from before --model-pool (a WSL install the app's update did not reach): argparse refuses it.
    import os, sys
    args = sys.argv[1:]
    if "--model-pool" in args:
        sys.stderr.write("usage: wslm serve [-h] [--model MODEL] ...\\n"
                         "wslm serve: error: unrecognized arguments: --model-pool all\\n")
        sys.exit(2)
    os.execv(sys.executable, [sys.executable, "-m", "wslm", *args])
""")


@pytest.mark.timeout(300)
def test_switch_restarts_a_server_without_a_pool(qtbot, tmp_path, monkeypatch):
    for name in ("tiny-a", "tiny-b"):
        make_tiny_chat_model(tmp_path / "models" / name)
    script = tmp_path / "old_wslm.py"
    script.write_text(OLD_WSLM)
    window, store = open_window(qtbot, tmp_path, monkeypatch, model="tiny-a")
    window.server.target = Target.local(wslm_command=[sys.executable, str(script)])
    chat, server = window.chat_panel, window.server
    states = []
    server.state_changed.connect(lambda s, _d: states.append(s))
    window.server_panel.start()  # while the models are listed (both take seconds)
    qtbot.waitUntil(lambda: {"tiny-a", "tiny-b"} <= set(window.models.table.ids()), timeout=90_000)
    qtbot.waitUntil(lambda: server.state in (READY, CRASHED), timeout=180_000)
    assert server.state == READY, window.logs.text()[-3000:]
    # It refused the flag: started again without it, and no crash was shown for that.
    assert server.pool_refused and "has no --model-pool" in window.logs.text() and CRASHED not in states
    qtbot.waitUntil(lambda: bool(window.pool.cards), timeout=30_000)
    assert not window.pool.pooled and not window.pool.can_load("tiny-b")  # one model, no `state`
    assert reply(window, qtbot, "Hi")["model"] == "tiny-a"
    pid = int(server.ready_event["pid"])

    states.clear()
    chat.choose_model("tiny-b")  # the fallback: stop, start with the new model, ready
    assert "Switching to tiny-b" in chat.switch_note.text() and not chat.switch_note.isHidden()
    qtbot.waitUntil(lambda: server.state == READY and server.config.model == "tiny-b", timeout=180_000)
    assert states[:2] == ["stopping", "stopped"] and "loading" in states and states[-1] == READY
    assert not alive(pid) and int(server.ready_event["pid"]) != pid
    assert "--model-pool" not in server.config.serve_args()
    assert window.server_panel.model_id() == "tiny-b" and chat.switch_note.isHidden()
    assert chat.model_combo.currentData() == "tiny-b"
    assert reply(window, qtbot, "Hello again")["model"] == "tiny-b"
    assert LOAD_CALL not in window.logs.text()
    close(window, store)


def test_serve_args_ask_for_the_pool_unless_the_extra_flags_name_one():
    args = ServerConfig(model="demo", model_pool=["all"]).serve_args()
    assert args[:2] == ["--model", "demo"] and args[args.index("--model-pool") + 1] == "all"
    assert "--model-pool" not in ServerConfig(model="demo").serve_args()
    own = ServerConfig(model="demo", model_pool=["all"], extra_args=["--model-pool", "small=./s.gguf"]).serve_args()
    assert own.count("--model-pool") == 1 and own[-2:] == ["--model-pool", "small=./s.gguf"]


def test_a_pool_switch_leaves_a_streaming_reply_alone(qtbot, tmp_path, fake_server):
    """Loading another model beside the running one cuts nothing: no question, the reply streams on; a failed
    load leaves the chat on its model. (The question for a restart: test_gui_newuser_a.)"""
    FakeOpenAI.delay, FakeOpenAI.repeat = 0.02, 20
    store = ChatStore(tmp_path / "chats.sqlite3")
    session = ChatSession(store, {"system_prompt": "", "max_tokens": 64})
    panel = ChatPanel(session, Settings(chat_use_server=True, system_prompt=""))
    qtbot.addWidget(panel)
    panel.set_installed_models([{"id": "demo", "format": "gguf", "path": "/m/demo.gguf"},
                                {"id": "tiny", "format": "hf", "path": "/m/tiny"}], "demo")
    panel.set_server(fake_server, "demo", "sk-test", 4096)
    panel.live_switch = lambda model_id: model_id == "tiny"
    switched = []
    panel.model_switch_requested.connect(switched.append)
    panel.confirm_switch = lambda n: pytest.fail("a pool switch cuts no reply: nothing to ask")
    panel.input.setPlainText("Tell me a story")
    panel.send()
    qtbot.waitUntil(lambda: len(session.messages.messages()[-1].content) > 10, timeout=10_000)
    panel.choose_model("tiny")
    assert switched == ["tiny"] and session.busy
    panel.show_load("tiny", "loading")
    assert "Loading tiny" in panel.switch_note.text() and panel.model_combo.currentData() == "tiny"
    panel.set_pool_states({"demo"}, "tiny")
    assert badges(panel.model_combo) == {"demo": True, "tiny": False, "\x00browse": False}
    with qtbot.waitSignal(session.reply_finished, timeout=10_000) as done:
        pass
    assert not done.args[0].get("stopped") and "interrupted" not in session.messages.messages()[-1].stats
    panel.show_load("tiny", "failed", "Not enough memory to load the model `tiny`.")
    assert panel.model_combo.currentData() == "demo" and session.model == "demo" and panel.switch_note.isHidden()
    assert "Not enough memory to load the model `tiny`. The chat stays with demo.gguf." in panel.error_label.text()
    assert session.current().model == "demo"  # the chat never talked to tiny
    session.shutdown()
    store.close()
