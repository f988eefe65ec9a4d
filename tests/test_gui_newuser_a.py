"""What a new user hit in the desktop app (issue 24), each replayed on the real widgets: the crash card
blaming the context length for any crash once one is set, `wslm gui` aborting without a display or Qt's xcb
libraries, Retry after the server was killed, a model switch cutting a streaming reply off, and a message
sent while the server loads."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytest.importorskip("PySide6")

import test_gui_chat  # noqa: E402
from PySide6.QtCore import QUrl  # noqa: E402
from test_gui_chat import WORDS, FakeOpenAI  # noqa: E402

from wslm.gui.chat_errors import describe_transport_error  # noqa: E402
from wslm.gui.chat_panel import ChatPanel  # noqa: E402
from wslm.gui.chat_session import ChatSession  # noqa: E402
from wslm.gui.chat_store import ChatStore  # noqa: E402
from wslm.gui.crash_hints import crash_cause, error_lines  # noqa: E402
from wslm.gui.display_check import apt_package, display_problem  # noqa: E402
from wslm.gui.main_window import MainWindow  # noqa: E402
from wslm.gui.server_controller import CRASHED, READY, STOPPING  # noqa: E402
from wslm.gui.settings import Settings  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
fake_server = test_gui_chat.fake_server  # the loopback OpenAI-style streamer
MODELS = [{"id": "demo", "format": "gguf", "path": "/m/demo.gguf"}, {"id": "tiny", "format": "hf", "path": "/m/tiny"}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def panel(qtbot, tmp_path):
    """The Chat panel on "wslm server" with no main window: tests play the server's part."""
    store = ChatStore(tmp_path / "chats.sqlite3")
    session = ChatSession(store, {"system_prompt": "", "max_tokens": 64})
    p = ChatPanel(session, Settings(chat_use_server=True, system_prompt=""))
    qtbot.addWidget(p)
    p.show()
    yield p
    session.shutdown()
    store.close()


def transcript(panel) -> str:
    panel.view.render()
    return panel.view.toPlainText()


# 2. The crash card
def test_crash_cause_reads_error_lines_not_the_echoed_command():
    command = "$ /usr/bin/python -m wslm serve --model demo --host 127.0.0.1 --port 8000 --max-model-len 512"
    # A bad extra flag: argparse's usage block names --max-model-len too.
    bad_flag = crash_cause(2, [command, "usage: wslm [-h] [--version] [-v] COMMAND ...",
                               "        [--max-model-len MAX_MODEL_LEN]",
                               "wslm: error: unrecognized arguments: --bogus-flag"])
    assert bad_flag.title == "A flag was not accepted" and bad_flag.field == "extra"
    # kill -9 after loading: the KV cache line (INFO) says max_model_len, which was merely set.
    info = ("INFO wslm.engine: KV cache: 128 blocks of 16 tokens = 2048 tokens (0.09 GiB); max_model_len 512; "
            "ready in 19.0s")
    killed = crash_cause(-9, [command, info, "2026-01-01 10:00:00,000 " + info, "INFO:     Application startup complete."])
    assert killed.title == "The server was killed"
    # A traceback's source lines quote code; its last line is the error.
    frames = ["Traceback (most recent call last):", '  File "/x/llm_engine.py", line 118, in __init__',
              "    num_blocks * config.block_size / mc.max_model_len,", "ZeroDivisionError: division by zero"]
    assert crash_cause(1, frames).field != "context"
    # A real context error is still recognised.
    real = crash_cause(1, [command, "ValueError: max_model_len=4096 does not fit in the KV cache, which holds 2048"])
    assert real.field == "context"
    assert error_lines([command, info, "ERROR: [Errno 98] Address already in use"]) == [
        "ERROR: [Errno 98] Address already in use"]


@pytest.mark.timeout(120)
def test_crash_card_for_a_bad_extra_flag_with_a_context_length_set(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    store = ChatStore(tmp_path / "chats.sqlite3")
    window = MainWindow(Settings(first_run_done=True, port=free_port(), max_model_len=512,
                                 serve_extra_args="--bogus-flag"), store, watch=False)
    qtbot.addWidget(window)
    window.show()
    panel = window.server_panel
    panel.start_button.click()
    qtbot.waitUntil(lambda: window.server.state == CRASHED, timeout=90_000)
    assert any("--max-model-len 512" in line for line in window.server.last_lines)  # the echo is there...
    text = panel.crash_box.text()
    assert "A flag was not accepted" in text and "Extra flags" in text  # ...and is not what gets blamed
    assert "context length" not in text.lower() and not panel.context.styleSheet()
    window.close()
    store.close()


# 3. `wslm gui` without a display or without Qt's xcb libraries
def gui_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM", "XDG_SESSION_TYPE", "WSL_DISTRO_NAME",
                        "WSL_INTEROP", "QT_QPA_PLATFORM_PLUGIN_PATH")}
    return {**env, **extra}


def run_gui(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**env, "WSLM_CONFIG_DIR": str(tmp_path / "config")}
    return subprocess.run([sys.executable, "-m", "wslm", "gui"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.timeout(150)
def test_gui_without_a_display_says_so_and_exits_cleanly(tmp_path):
    p = run_gui(gui_env(), tmp_path)
    assert p.returncode == 1, (p.returncode, p.stderr[-2000:])  # not 134 (SIGABRT)
    assert "there is no display" in p.stderr and "DISPLAY" in p.stderr and "qt.qpa" not in p.stderr
    # Under WSL without WSLg, the fix is WSL's.
    p = run_gui(gui_env(WSL_DISTRO_NAME="Ubuntu"), tmp_path)
    assert p.returncode == 1 and "this WSL has no display" in p.stderr and "wsl --update" in p.stderr


@pytest.mark.timeout(150)
def test_gui_without_the_xcb_libraries_names_the_apt_line(tmp_path):
    # ldd as on a fresh Ubuntu: two of the plugin's libraries are missing.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ldd = bin_dir / "ldd"
    ldd.write_text("#!/bin/sh\necho '\tlibxcb-cursor.so.0 => not found'\necho '\tlibxkbcommon-x11.so.0 => not found'\n"
                   "echo '\tlibxcb-cursor.so.0 => not found'\necho '\tlibc.so.6 => /lib/libc.so.6 (0x1)'\n")
    ldd.chmod(0o755)
    env = gui_env(DISPLAY=":0", PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    p = run_gui(env, tmp_path)
    assert p.returncode == 1, (p.returncode, p.stderr[-2000:])
    assert "sudo apt-get install -y libxcb-cursor0 libxkbcommon-x11-0\n" in p.stderr and "qt.qpa" not in p.stderr
    # Headless platforms need neither; Wayland with a compositor needs no X11 libraries.
    assert display_problem(gui_env(QT_QPA_PLATFORM="offscreen"), "linux") is None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as compositor:  # a socket that accepts, as one's
        compositor.bind(str(tmp_path / "wayland-0"))
        compositor.listen(4)
        assert display_problem(gui_env(WAYLAND_DISPLAY="wayland-0", XDG_RUNTIME_DIR=str(tmp_path),
                                       XDG_SESSION_TYPE="wayland", PATH=env["PATH"]), "linux") is None
    assert display_problem(gui_env(), "win32") is None


def test_apt_package_names_match_doctors_table():
    try:
        from wslm.backend.entrypoints.cli.doctor import QT_XCB_LIBS
    except ImportError:  # the backend's old layout
        from wslm.backend.doctor import QT_XCB_LIBS
    assert {lib: apt_package(lib) for lib in QT_XCB_LIBS} == QT_XCB_LIBS


# 4 and 9. No server, a server loading, a server that went away
def test_empty_url_is_said_as_server_not_running():
    kind, message = describe_transport_error(ValueError("Request URL is missing an 'http://' protocol."), "")
    assert kind == "down" and "not running" in message and "Request to" not in message


def test_a_message_sent_while_the_server_loads_goes_out_when_it_is_ready(panel, fake_server, qtbot):
    panel.set_server_state("loading", True)
    panel.input.setPlainText("Hello while loading")
    panel.send()
    note = panel.error_label.text()
    assert "No server to talk to" not in note and "as soon as it is" in note and panel.error_label.isVisible()
    assert panel.input.toPlainText() == ""  # it is in the chat, waiting
    assert [(m.role, m.content) for m in panel.session.messages.messages()] == [("user", "Hello while loading")]
    assert not FakeOpenAI.requests
    with qtbot.waitSignal(panel.session.reply_finished, timeout=10_000):
        panel.set_server_state("ready", False)
        panel.set_server(fake_server, "demo", "sk-test", 4096)  # what the main window does on "ready"
    assert panel.error_label.isHidden()  # the waiting line goes with the wait
    assert FakeOpenAI.requests[-1]["messages"][-1] == {"role": "user", "content": "Hello while loading"}
    assert panel.session.messages.messages()[-1].content == "".join(WORDS)


def test_a_waiting_message_is_kept_when_the_server_crashes_instead(panel, qtbot):
    panel.set_server_state("loading", True)
    panel.input.setPlainText("Will it come?")
    panel.send()
    panel.set_server_state("crashed", False, "The GPU ran out of memory")
    text = panel.error_label.text()
    assert "stopped before it was ready" in text and "GPU ran out of memory" in text and "href='start'" in text
    assert [m.content for m in panel.session.messages.messages()] == ["Will it come?"]
    assert panel.pending is None


def test_retry_with_the_server_gone_offers_to_start_it(panel, fake_server, qtbot):
    # A reply failed (the server was killed under it); the server is gone, so the chat has no URL.
    panel.session.send("Hi")
    qtbot.waitUntil(lambda: not panel.session.busy, timeout=10_000)
    assert panel.session.messages.messages()[-1].error
    asked = []

    def start_server():  # the main window's part: the server starts, and says so
        asked.append(True)
        panel.set_server_state("starting", True)

    panel.start_server_requested.connect(start_server)
    panel.view._on_link(QUrl("regen:1"))  # the Retry link
    text = panel.error_label.text()
    assert "not running" in text and "href='start'" in text and "reply is retried" in text
    assert len(panel.session.messages.messages()) == 2 and not panel.session.busy
    assert "Request to  failed" not in transcript(panel)
    panel.error_label.linkActivated.emit("start")  # "start it"
    assert asked and panel.pending == (panel.session.messages.conversation_id, 1)
    with qtbot.waitSignal(panel.session.reply_finished, timeout=10_000):
        panel.set_server(fake_server, "demo", "sk-test", 4096)
    msgs = panel.session.messages.messages()
    assert [m.role for m in msgs] == ["user", "assistant"] and not msgs[-1].error
    assert msgs[-1].content == "".join(WORDS) and panel.error_label.isHidden()


def test_send_with_the_server_stopped_offers_to_start_it_and_sends_when_ready(panel, fake_server, qtbot):
    panel.start_server_requested.connect(lambda: panel.set_server_state("starting", True))
    panel.input.setPlainText("First message")
    panel.send()
    assert "not running" in panel.error_label.text() and panel.input.toPlainText() == "First message"
    panel.start_server()
    assert panel.input.toPlainText() == "" and panel.pending is not None
    with qtbot.waitSignal(panel.session.reply_finished, timeout=10_000):
        panel.set_server(fake_server, "demo", "sk-test", 4096)
    assert [m.role for m in panel.session.messages.messages()] == ["user", "assistant"]


# 5. Switching model while a reply streams
def test_model_switch_during_a_reply_asks_and_keeps_the_text(panel, fake_server, qtbot):
    FakeOpenAI.delay, FakeOpenAI.repeat = 0.05, 40
    panel.set_installed_models(MODELS, "demo")
    panel.set_server(fake_server, "demo", "sk-test", 4096)
    switched, asked = [], []
    panel.model_switch_requested.connect(switched.append)
    panel.input.setPlainText("Tell me a long story")
    panel.send()
    qtbot.waitUntil(lambda: len(panel.session.messages.messages()[-1].content) > 20, timeout=10_000)
    # "Cancel": nothing is cut, the picker goes back to the model writing the reply.
    panel.confirm_switch = lambda n: asked.append(n) or False
    panel.choose_model("tiny")
    assert asked == [1] and not switched and panel.session.busy and panel.model_combo.currentData() == "demo"
    # "Yes": the reply ends now, its text kept, marked interrupted; then the switch goes ahead.
    panel.confirm_switch = lambda n: True
    panel.choose_model("tiny")
    assert switched == ["tiny"] and not panel.session.busy
    reply = panel.session.messages.messages()[-1]
    assert len(reply.content) > 20 and reply.stats["interrupted"] == "the model was switched" and not reply.error
    assert "interrupted: the model was switched" in transcript(panel)
    saved = panel.session.store.messages(panel.session.messages.conversation_id)[-1]
    assert saved.content == reply.content and saved.stats["interrupted"]


def test_server_stopping_under_a_reply_marks_it_interrupted(qtbot, tmp_path, monkeypatch, fake_server):
    FakeOpenAI.delay, FakeOpenAI.repeat = 0.05, 40
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    store = ChatStore(tmp_path / "chats.sqlite3")
    window = MainWindow(Settings(first_run_done=True, system_prompt=""), store, watch=False)
    qtbot.addWidget(window)
    chat = window.chat_panel
    chat.set_server(fake_server, "demo", "sk-test", 4096)  # as if our server were ready at this URL
    chat.input.setPlainText("Go on")
    chat.send()
    qtbot.waitUntil(lambda: len(window.session.messages.messages()[-1].content) > 10, timeout=10_000)
    window.server.state_changed.emit(STOPPING, "Stopping…")  # a restart from the Server panel
    reply = window.session.messages.messages()[-1]
    assert not window.session.busy and len(reply.content) > 10
    assert reply.stats["interrupted"] == "the server was stopped"
    window.close()
    store.close()


# 2, 4 and 9 with a real server: send while it loads, kill -9, Retry, start it from the chat.
def serve_children() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "serve" in p.cmdline() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.timeout(400)
def test_real_server_send_while_loading_kill_and_retry(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    store = ChatStore(tmp_path / "chats.sqlite3")
    window = MainWindow(Settings(first_run_done=True, port=free_port(), model="demo", max_model_len=512,
                                 serve_extra_args="--max-num-seqs 2", max_tokens=4, system_prompt=""),
                        store, watch=False)
    qtbot.addWidget(window)
    window.show()
    chat, server, session = window.chat_panel, window.server, window.session

    window.server_panel.start()
    chat.input.setPlainText("Say hi.")
    chat.send()  # while it starts
    assert "No server to talk to" not in chat.error_label.text() and chat.input.toPlainText() == ""
    # Sent by itself once the server is ready.
    qtbot.waitUntil(lambda: server.state == CRASHED or len(session.messages.messages()) == 2
                    and not session.busy, timeout=240_000)
    assert server.state == READY, window.logs.text()[-3000:]
    assert chat.error_label.isHidden()
    first = session.messages.messages()[-1]
    assert first.role == "assistant" and first.content and not first.error

    os.kill(int(server.ready_event["pid"]), signal.SIGKILL)
    qtbot.waitUntil(lambda: server.state == CRASHED, timeout=30_000)
    card = window.server_panel.crash_box.text()
    assert "The server was killed" in card and "context length does not fit" not in card

    chat.view._on_link(QUrl("regen:1"))  # Regenerate/Retry on the reply
    assert "not running" in chat.error_label.text() and "href='start'" in chat.error_label.text()
    assert "Request to" not in transcript(chat)
    with qtbot.waitSignal(session.reply_finished, timeout=240_000):
        chat.error_label.linkActivated.emit("start")
    msgs = session.messages.messages()
    assert [m.role for m in msgs] == ["user", "assistant"] and msgs[-1].content and not msgs[-1].error
    assert server.state == READY and chat.error_label.isHidden()
    window.close()
    assert not serve_children()
    store.close()
