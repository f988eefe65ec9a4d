"""The server panel starts a real `wslm serve` on the demo model (local launcher, loopback port), the chat
streams a reply from it, Stop ends the stream (the server aborts the request), and Stop stops the server."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("PySide6")

from PySide6.QtCore import QTimer  # noqa: E402

from wslm.gui.chat_store import ChatStore  # noqa: E402
from wslm.gui.main_window import MainWindow  # noqa: E402
from wslm.gui.metrics import metric, parse_prometheus  # noqa: E402
from wslm.gui.server_controller import CRASHED, READY, STOPPED  # noqa: E402
from wslm.gui.settings import Settings  # noqa: E402

# Small KV cache and context: loads fast on a shared CPU.
FAST_FLAGS = "--kv-cache-memory 64MiB --max-num-seqs 4"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def running_requests(base: str) -> float:
    text = httpx.get(base.removesuffix("/v1") + "/metrics", timeout=5,
                     headers={"Authorization": "Bearer sk-gui-test"}).text
    return metric(parse_prometheus(text), "num_requests_running")


@pytest.mark.timeout(400)
def test_server_panel_real_backend_chat_stream_and_stop(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    settings = Settings(first_run_done=True, port=free_port(), model="demo", max_model_len=1024,
                        serve_extra_args=FAST_FLAGS, max_tokens=400, system_prompt="", api_key="sk-gui-test")
    store = ChatStore(tmp_path / "chats.sqlite3")
    window = MainWindow(settings, store, watch=False)
    qtbot.addWidget(window)
    window.show()
    panel = window.server_panel
    states = []
    window.server.state_changed.connect(lambda s, _d: states.append(s))

    panel.start_button.click()
    qtbot.waitUntil(lambda: window.server.state in (READY, CRASHED), timeout=300_000)
    assert window.server.state == READY, f"server did not start: {window.server.detail}\n{window.logs.text()[-3000:]}"
    # Loading repeats while the load progress updates its detail ("Loading demo… 43% (312 MB/s)").
    assert [s for i, s in enumerate(states) if not i or s != states[i - 1]][:3] == ["starting", "loading", "ready"]
    assert panel.badge.text() == "Ready" and not panel.start_button.isEnabled()
    assert "Backend ready" in window.status.state.text()
    assert any("wslm" in window.logs.data(window.logs.index(i)) for i in range(window.logs.rowCount()))

    # The chat follows the server on its own.
    base = window.session.base_url
    assert base == f"http://127.0.0.1:{settings.port}/v1" and window.session.model == "demo"
    # The key reached the server through the environment, not the command line (nor the log).
    assert httpx.get(base + "/models", timeout=5).status_code == 401
    assert "sk-gui-test" not in window.logs.text() and window.session.api_key == "sk-gui-test"
    chat = window.chat_panel
    window.sidebar.select("chat")
    chat.input.setPlainText("Tell me a long story about a cat who learns to sail.")

    ticks = []
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(time.monotonic()))
    timer.start(20)
    with qtbot.waitSignal(window.session.first_token, timeout=120_000):
        chat.send_button.click()
    assert chat.input.toPlainText() == ""  # sent
    qtbot.waitUntil(lambda: len(window.session.messages.messages()[-1].content) > 20, timeout=60_000)
    assert chat.stop_button.isVisible() and not chat.send_button.isVisible()
    t_stop = time.monotonic()
    chat.stop_button.click()
    timer.stop()
    assert time.monotonic() - t_stop < 0.5  # Stop does not wait for the server
    assert chat.send_button.isVisible()
    reply = window.session.messages.messages()[-1]
    assert reply.role == "assistant" and reply.content and reply.stats.get("stopped") is True
    # The event loop kept turning while tokens streamed in (no gap near a second).
    assert len(ticks) > 5 and max(b - a for a, b in zip(ticks, ticks[1:], strict=False)) < 1.0
    # The connection closed, so the server aborted the request.
    qtbot.waitUntil(lambda: running_requests(base) == 0, timeout=20_000)
    qtbot.wait(300)
    content_after_stop = reply.content
    assert window.session.messages.messages()[-1].content == content_after_stop
    # The reply and the question are in SQLite.
    saved = store.messages(window.session.messages.conversation_id)
    assert [m.role for m in saved] == ["user", "assistant"] and saved[1].content == content_after_stop

    # A second, complete reply gets its tokens/s and TTFT line.
    chat.input.setPlainText("Say hi.")
    window.session.store.update_conversation(window.session.messages.conversation_id, max_tokens=8)
    with qtbot.waitSignal(window.session.reply_finished, timeout=120_000) as done:
        chat.send_button.click()
    assert done.args[0]["tokens"] > 0 and done.args[0]["ttft_s"] is not None
    chat.view.render()
    assert "TTFT" in chat.view.toPlainText()

    panel.stop_button.click()
    assert window.server.state == "stopping"
    qtbot.waitUntil(lambda: window.server.state == STOPPED, timeout=30_000)
    assert panel.start_button.isEnabled()
    assert window.session.base_url == ""  # the chat knows the server is gone
    with pytest.raises(httpx.ConnectError):
        httpx.get(base.removesuffix("/v1") + "/health", timeout=2)
    window.close()
    store.close()


def test_crash_shows_cause(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    # The port is taken: the real server fails to bind; the panel says so, with the fix.
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]
    settings = Settings(first_run_done=True, port=port, model="no-such-model-anywhere")
    window = MainWindow(settings, ChatStore(tmp_path / "c.sqlite3"), watch=False)
    qtbot.addWidget(window)
    window.server_panel.start_button.click()
    qtbot.waitUntil(lambda: window.server.state == CRASHED, timeout=120_000)
    assert window.server_panel.crash_box.isVisible() or not window.isVisible()
    text = window.server_panel.crash_box.text()
    assert "The port is taken" in text and "“Port”" in text  # the cause, and the field to change
    blocker.close()
    window.close()


@pytest.mark.timeout(300)
def test_wsl_target_hung_backend_is_detected_and_killed(qtbot, tmp_path, monkeypatch):
    """Through (fake) wsl.exe: models list and serve run in the "distro"; a backend that stops answering
    /health is reported as crashed and killed by its Linux PID, not left behind."""
    import os
    import signal

    from fake_windows import use

    from wslm.gui import server_controller
    from wslm.wsl_bridge.launcher import Target

    use(monkeypatch, tmp_path)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(server_controller, "HEALTH_INTERVAL_MS", 400)
    monkeypatch.setattr(server_controller, "HEALTH_FAILURES_TO_CRASH", 2)
    settings = Settings(first_run_done=True, port=free_port(), max_model_len=1024, serve_extra_args=FAST_FLAGS,
                        target={"kind": "wsl", "distro": "Ubuntu"})
    window = MainWindow(settings, ChatStore(tmp_path / "c.sqlite3"), watch=False)
    qtbot.addWidget(window)
    assert window.server.target == Target.wsl("Ubuntu")
    assert window.server_panel.target_label.text() == "WSL: Ubuntu"
    qtbot.waitUntil(lambda: not window.models.loading, timeout=60_000)
    assert "demo" in window.models.table.ids(), window.logs.text()[-2000:]

    # Stop while it is still starting: there is no Linux PID yet, so it stops as soon as it reports one
    # (killing wsl.exe would leave it serving in the distro).
    window.server_panel.start_button.click()
    window.server_panel.stop_button.click()
    assert window.server.state == "stopping"
    qtbot.waitUntil(lambda: window.server.state in (STOPPED, CRASHED), timeout=300_000)
    assert window.server.state == STOPPED, window.logs.text()[-3000:]
    stopped_pid = int(window.server.ready_event.get("pid") or window.server._backend_pid)  # loading names it too
    assert stopped_pid and not _alive(stopped_pid)

    window.server_panel.start_button.click()
    qtbot.waitUntil(lambda: window.server.state in (READY, CRASHED), timeout=300_000)
    assert window.server.state == READY, window.logs.text()[-3000:]
    first_pid = int(window.server.ready_event["pid"])
    assert "wsl.exe" in window.logs.text()
    # Restart = Stop by the Linux PID (kill -TERM through wsl.exe), then a fresh start.
    states = []
    window.server.state_changed.connect(lambda s, _d: states.append(s))
    window.server_panel.restart_button.click()
    qtbot.waitUntil(lambda: states[-1:] == [READY] or CRASHED in states, timeout=300_000)
    assert states[:2] == ["stopping", "stopped"] and states[-1] == READY, window.logs.text()[-3000:]
    assert not _alive(first_pid)
    pid = int(window.server.ready_event["pid"])
    assert pid != first_pid
    os.kill(pid, signal.SIGSTOP)  # hung: the port still accepts, nothing answers
    try:
        qtbot.waitUntil(lambda: window.server.state == CRASHED, timeout=30_000)
        assert "/health" in window.server.detail
        qtbot.waitUntil(lambda: not _alive(pid), timeout=20_000)
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    window.close()


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


@pytest.mark.timeout(120)
def test_auto_restart_after_a_crash(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    settings = Settings(first_run_done=True, port=free_port(), model="no-such-model-anywhere", auto_restart=True)
    window = MainWindow(settings, ChatStore(tmp_path / "c.sqlite3"), watch=False)
    qtbot.addWidget(window)
    states = []
    window.server.state_changed.connect(lambda s, _d: states.append(s))
    window.server_panel.start_button.click()
    qtbot.waitUntil(lambda: states.count(CRASHED) >= 1 and states[-1] == "starting", timeout=90_000)
    assert "auto-restart in 2 s" in window.logs.text()
    window.server_panel.auto_restart.setChecked(False)
    qtbot.waitUntil(lambda: window.server.state == CRASHED, timeout=90_000)
    window.server_panel.stop_button.click()  # a crashed server: Stop clears it
    assert window.server.state in (CRASHED, STOPPED)
    window.close()
