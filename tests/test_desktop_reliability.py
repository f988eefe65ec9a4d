"""The desktop side under abuse: the app killed with SIGKILL mid-reply keeps the partial reply (marked cut) in
its real SQLite file; two processes writing share.json at once (the CLI and the GUI) lose nothing and leave
valid JSON; quitting the app while a WSL backend is still loading leaves no backend running in the distro."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("PySide6")

REPO = Path(__file__).resolve().parents[1]

# The app's own chat session in a child process, fed deltas as the stream worker feeds them, then killed -9.
CHILD = textwrap.dedent("""
    import os, sys, time
    from PySide6.QtCore import QCoreApplication
    from wslm.gui import chat_session
    from wslm.gui.chat_store import ChatStore

    chat_session.StreamWorker.start = lambda self: None  # no network: the deltas come from here
    app = QCoreApplication([])
    session = chat_session.ChatSession(ChatStore(sys.argv[1]))
    session.send("Tell me a long story.")
    fed = ""
    start = time.monotonic()
    while time.monotonic() - start < 1.3:
        word = f"w{len(fed)} "
        session._on_delta(word)
        fed += word
        time.sleep(0.01)
    print(fed, flush=True)
    os.kill(os.getpid(), 9)
""")


def test_chat_reply_survives_kill_9_mid_stream(tmp_path):
    from wslm.gui.chat_store import ChatStore

    db = tmp_path / "chats.sqlite3"
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-c", CHILD, str(db)], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    fed = p.stdout.strip()
    assert len(fed) > 100
    store = ChatStore(db)  # reopening recovers the cut reply
    conv = store.list_conversations()[0]
    user, reply = store.messages(conv.id)
    assert user.content == "Tell me a long story." and reply.role == "assistant"
    assert reply.content and fed.startswith(reply.content.strip()) and len(reply.content) > len(fed) // 3
    assert reply.stats.get("cut") and reply.stats.get("stopped") and not reply.error
    store.close()
    assert ChatStore(db).recover_cut_replies() == 0  # marked once, not again


WRITER = textwrap.dedent("""
    import sys
    from wslm.wsl_bridge import state
    who, count = sys.argv[1], int(sys.argv[2])
    for i in range(count):
        with state.locked() as st:
            st.put(state.OwnedRule("firewall", 1000 + i, name=f"wslm-{who}-{i}"))
            st.shares[f"{who}{i}"] = {"distro": who, "mode": "nat"}
""")


def test_share_json_with_two_writers_at_once(tmp_path):
    env = {**os.environ, "WSLM_CONFIG_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, who, "60"], env=env, stderr=subprocess.PIPE, text=True)
             for who in ("cli", "gui")]
    for p in procs:
        assert p.wait(120) == 0, p.stderr.read()
    data = json.loads((tmp_path / "share.json").read_text(encoding="utf-8"))
    names = {r["name"] for r in data["rules"]}
    assert names == {f"wslm-{who}-{i}" for who in ("cli", "gui") for i in range(60)}
    assert len(data["shares"]) == 120
    assert not list(tmp_path.glob(".share.*.tmp"))


@pytest.mark.timeout(300)
def test_quit_while_a_wsl_backend_loads_leaves_no_backend(qtbot, tmp_path, monkeypatch):
    from fake_windows import use
    from fault_executor import BACKEND, server_env
    from test_gui_server import FAST_FLAGS, free_port

    from wslm.gui import server_controller
    from wslm.gui.chat_store import ChatStore
    from wslm.gui.main_window import MainWindow
    from wslm.gui.settings import Settings

    use(monkeypatch, tmp_path)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_WSL_DETACHED", "1")  # killing wsl.exe leaves the Linux process, as on Windows
    for name, value in server_env({"load_delay_s": 120}).items():  # a model that takes minutes to load
        monkeypatch.setenv(name, value)
    settings = Settings(first_run_done=True, port=free_port(), max_model_len=1024,
                        serve_extra_args=f"{FAST_FLAGS} --distributed-executor-backend {BACKEND}",
                        target={"kind": "wsl", "distro": "Ubuntu"})
    window = MainWindow(settings, ChatStore(tmp_path / "c.sqlite3"), watch=False)
    qtbot.addWidget(window)
    window.server_panel.start_button.click()
    assert window.server.state == server_controller.STARTING
    qtbot.waitUntil(lambda: window.server._backend_pid > 0, timeout=120_000)  # "loading", with the Linux PID
    pid = window.server._backend_pid
    assert _alive(pid) and window.server.state == server_controller.LOADING
    try:
        started = time.monotonic()
        window.server.shutdown()  # what quitting the app does
        assert time.monotonic() - started < 30  # did not wait for the model to load
        deadline = time.monotonic() + 20
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid), "the backend was left running in the distro"
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    window.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
