"""The rough edges a first walk-through found (issue 16's "Bugs seen"), each checked on the real widgets:
focus after Send/Stop, replies that keep streaming in the background, the rename box, stale figures after
Stop, the chat URL following the port, crash wording, Linux share wording, the download failure card, log
lines, Quit, narrow windows, display names, Qt's xcb libraries."""

from __future__ import annotations

import socket
import sys

import pytest

pytest.importorskip("PySide6")

import test_gui_chat  # noqa: E402
from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtTest import QTest  # noqa: E402
from PySide6.QtWidgets import QApplication, QLineEdit  # noqa: E402
from test_gui_chat import WORDS, FakeOpenAI  # noqa: E402

from wslm.backend.entrypoints.cli.doctor import Probe, check_qt_xcb  # noqa: E402
from wslm.gui.chat_model import BusyRole  # noqa: E402
from wslm.gui.chat_store import ChatStore  # noqa: E402
from wslm.gui.download_job import FAILED  # noqa: E402
from wslm.gui.log_model import LogModel  # noqa: E402
from wslm.gui.main_window import MainWindow  # noqa: E402
from wslm.gui.models_model import display_name  # noqa: E402
from wslm.gui.server_controller import CRASHED, READY, STOPPED  # noqa: E402
from wslm.gui.settings import Settings  # noqa: E402

fake_server = test_gui_chat.fake_server  # the loopback OpenAI-style streamer, as a fixture here too


@pytest.fixture
def window(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    store = ChatStore(tmp_path / "chats.sqlite3")
    w = MainWindow(Settings(first_run_done=True, port=8123, system_prompt="", chat_use_server=False),
                   store, watch=False)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    yield w
    w.session.shutdown()
    w.close()
    store.close()


def use_fake(window, url: str) -> None:
    chat = window.chat_panel
    chat.url.setText(url)
    chat.key.setText("sk-test")
    chat._connection_edited()
    chat.model_combo.setCurrentText("demo")


def test_focus_returns_to_the_message_box_after_send_and_stop(window, fake_server, qtbot):
    FakeOpenAI.delay, FakeOpenAI.repeat = 0.05, 20
    use_fake(window, fake_server)
    chat = window.chat_panel
    window.activateWindow()
    chat.input.setFocus()
    chat.input.setPlainText("Hello")
    QTest.mouseClick(chat.send_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.session.busy and chat.stop_button.isVisible())
    assert QApplication.focusWidget() is chat.input
    qtbot.waitUntil(lambda: len(window.session.messages.messages()[-1].content) > 10)
    QTest.mouseClick(chat.stop_button, Qt.MouseButton.LeftButton)
    assert not window.session.busy and QApplication.focusWidget() is chat.input
    QTest.keyClicks(QApplication.focusWidget(), "next question")
    assert chat.input.toPlainText() == "next question" and "next" not in chat.system_prompt.toPlainText()
    # A stopped reply keeps what was measured until the stop.
    stats = window.session.messages.messages()[-1].stats
    assert stats["stopped"] and stats["tokens"] > 1 and stats["ttft_s"] is not None


def test_switching_chats_keeps_the_reply_streaming_in_the_background(window, fake_server, qtbot):
    FakeOpenAI.delay, FakeOpenAI.repeat = 0.03, 6
    use_fake(window, fake_server)
    session, chat = window.session, window.chat_panel
    chat.input.setPlainText("first chat")
    chat.send()
    first = session.messages.conversation_id
    qtbot.waitUntil(lambda: len(session.messages.messages()[-1].content) > 5)
    chat.new_chat()  # leave it while it streams
    convs = session.conversations
    row = convs.row_of(first)
    assert convs.index(row).data(BusyRole) and convs.index(row).data().startswith("● ")
    assert not session.busy and chat.send_button.isVisible()  # the new chat is free
    chat.input.setPlainText("second chat")  # and can talk at the same time
    chat.send()
    second = session.messages.conversation_id
    session.open(first)  # back while it still streams: the live text, still growing
    assert session.busy and chat.stop_button.isVisible()
    n = len(session.messages.messages()[-1].content)
    qtbot.waitUntil(lambda: len(session.messages.messages()[-1].content) > n, timeout=5000)
    session.open(second)
    expected = "".join(WORDS * 6)
    qtbot.waitUntil(lambda: not session.streaming_ids, timeout=20_000)
    for conv_id in (first, second):
        saved = window.store.messages(conv_id)[-1]
        assert saved.content == expected and saved.stats.get("tokens") == len(WORDS) * 6 and not saved.error
    assert not convs.index(convs.row_of(first)).data(BusyRole)


def test_a_reply_fits_a_shorter_context_after_a_switch(window, fake_server, qtbot):
    # After switching to a model with a 512-token context, the chat's 1024 max tokens would be a 400
    # ("conversation is too long"): the request leaves max_tokens out and the server fills the rest.
    chat, session = window.chat_panel, window.session
    chat.use_server.setChecked(True)
    chat.set_server(fake_server, "demo", "sk-test", 4096)
    for context in (4096, 512):
        chat.set_server(fake_server, "demo", "sk-test", context)
        chat.input.setPlainText("hi")
        with qtbot.waitSignal(session.reply_finished, timeout=10_000):
            chat.send()
    sent = [r.get("max_tokens") for r in FakeOpenAI.requests]
    assert sent == [session.current().max_tokens, None] and session.current().max_tokens > 512


def test_a_chat_offers_its_own_model_back(window, fake_server, qtbot):
    chat, session = window.chat_panel, window.session
    chat.model_switch_requested.disconnect(window.switch_model)  # no real server restart here
    asked = []
    chat.model_switch_requested.connect(asked.append)
    chat.use_server.setChecked(True)
    chat.set_installed_models([{"id": "demo", "path": "/m/SmolLM2-135M-Instruct.Q4_1.gguf", "format": "gguf"},
                               {"id": "tiny", "repo_id": "org/Tiny-Chat"}])
    chat.set_server(fake_server, "demo", "sk-test", 4096)
    chat.new_chat()
    chat.input.setPlainText("hi")
    with qtbot.waitSignal(session.reply_finished, timeout=10_000):
        chat.send()
    assert session.current().model == "demo" and chat.model_hint.isHidden()  # the chat remembers its model
    first = session.current().id
    window.store.update_conversation(first, model="tiny")  # as if it had talked to tiny
    chat.new_chat()
    assert chat.model_hint.isHidden()  # a new chat has no model of its own yet
    session.open(first)
    assert not chat.model_hint.isHidden() and "org/Tiny-Chat" in chat.model_hint.text()
    chat.model_hint.linkActivated.emit("tiny")
    assert asked == ["tiny"]
    chat.set_server(fake_server, "tiny", "sk-test", 4096)
    assert chat.model_hint.isHidden()


def test_rename_box_is_not_clipped(window, qtbot):
    chat = window.chat_panel
    chat.new_chat()
    chat.list.edit(window.session.conversations.index(0))
    editor = next(w for w in chat.list.viewport().findChildren(QLineEdit) if w.isVisible())
    assert editor.height() >= editor.sizeHint().height()
    assert editor.contentsRect().height() >= editor.fontMetrics().height()


def test_stop_clears_stale_figures_and_status_speed_is_the_replys(window):
    panel, status = window.server_panel, window.status
    panel.show_metrics({"kv_cache_usage": 0.3, "running": 1, "waiting": 0, "tokens_per_s": 13.3,
                        "generation_tokens_total": 80})
    window._on_metrics({"kv_cache_usage": 0.3, "tokens_per_s": 13.3})
    assert "tok/s" in status.speed.text() and "13.3" not in status.speed.text()  # not the server-wide rate
    window.session.reply_finished.emit({"tokens_per_s": 3.5})
    assert status.speed.text() == "3.5 tok/s"  # the figure under the message
    window.server.state_changed.emit(STOPPED, "Stopped")
    for key in ("kv", "tps"):
        assert not panel.plots[key].values and not panel.plots[key].caption
    assert status.speed.text() == "— tok/s"


def test_ready_warning_is_shown_in_the_server_panel(window):
    # The launcher's ready event carries `warning` when the server is on the LAN with no key (tests/test_security.py).
    panel, server = window.server_panel, window.server
    server.state_changed.emit(READY, "demo")
    server.ready.emit({"event": "ready", "host": "0.0.0.0", "port": 8123, "model": "demo",
                       "warning": "This server listens on 0.0.0.0 ... has NO API key ... Pass --api-key KEY"})
    text = panel.warning_box.text()
    assert not panel.warning_box.isHidden() and "no API key" in text and "“API key” field" in text
    assert "--api-key" not in text and "--api-key" in panel.warning_box.toolTip()
    assert panel.api_key.styleSheet()  # the field to fill is outlined
    server.state_changed.emit(STOPPED, "Stopped")
    assert panel.warning_box.isHidden() and not panel.api_key.styleSheet()
    server.ready.emit({"event": "ready", "host": "127.0.0.1", "port": 8123, "model": "demo"})
    assert panel.warning_box.isHidden()


def test_chat_url_follows_the_servers_port(window):
    chat = window.chat_panel
    chat.use_server.setChecked(True)
    assert chat.url.text() == "http://127.0.0.1:8123/v1" and not chat.url.isEnabled()
    window.server_panel.port.setValue(8200)
    assert chat.url.text() == "http://127.0.0.1:8200/v1"
    chat.set_server("http://127.0.0.1:8311/v1", "demo", "")
    assert chat.url.text() == "http://127.0.0.1:8311/v1" and window.session.base_url.endswith(":8311/v1")
    chat.use_custom.setChecked(True)  # the user's own URL was not overwritten by the server's
    assert chat.url.text() == "http://127.0.0.1:8000/v1"


@pytest.mark.timeout(120)
def test_crash_box_names_the_cause_and_the_field(window, qtbot):
    panel = window.server_panel
    panel.set_model("no-such-model-anywhere")
    panel.start_button.click()
    qtbot.waitUntil(lambda: window.server.state == CRASHED, timeout=60_000)
    text = panel.crash_box.text()
    assert "Model not found" in text and "Model box" in text
    assert "stopped unexpectedly" not in text and "wslm models pull" not in text and "--" not in text
    assert panel.model.styleSheet()  # the field to change is outlined
    first_run = list(window.server.last_lines)
    assert first_run
    # Second run: the port is taken. Only this run's lines are quoted; the cause names the Port field.
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    panel.port.setValue(blocker.getsockname()[1])
    panel.set_model("demo")
    panel.start_button.click()
    qtbot.waitUntil(lambda: window.server.state == CRASHED and window.server.cause.field == "port", timeout=60_000)
    blocker.close()
    text = panel.crash_box.text()
    assert "The port is taken" in text and "“Port”" in text and "--port" not in text
    assert "no-such-model-anywhere" not in "\n".join(window.server.last_lines)
    assert panel.port.styleSheet() and not panel.model.styleSheet()
    assert panel.log.minimumHeight() >= 150 and text.count("<br>") <= 12


def test_crash_causes_from_the_engines_own_messages():
    from wslm.gui.crash_hints import crash_cause

    def cause(line: str):
        return crash_cause(1, ["Traceback (most recent call last):", f"ValueError: {line}"])

    gpu = cause("No GPU memory left for the KV cache: the card has 8.0 GiB, 7.9 GiB are in use after loading")
    assert gpu.field == "gpu" and "GPU memory share" in gpu.advice
    assert cause("The KV cache budget (1 MiB) holds fewer than 2 blocks of 16 tokens").field == "extra"
    assert cause("OSError: [Errno 98] Address already in use").field == "port"
    assert crash_cause(3, ["something else"]).title == "The server stopped unexpectedly"  # only when unknown


def test_share_on_linux_speaks_the_apps_language(window, qtbot, monkeypatch):
    monkeypatch.delenv("WSLM_WINDOWS_BIN", raising=False)
    panel = window.share_panel
    assert not panel.key_edit.text()
    assert not any(b.isEnabled() for b in panel.key_buttons)  # no key: nothing to show, copy or regenerate
    with qtbot.waitSignal(window.share.failed, timeout=30_000):
        panel.switch.click()
    text = panel.notes.text()
    assert "Windows" in text and "NotWindowsError" not in text and "fix:" not in text and "PowerShell" not in text
    assert any("share on failed:" in window.logs.data(window.logs.index(i)) for i in range(window.logs.rowCount()))
    panel.key_edit.setText("sk-wslm-x")
    assert all(b.isEnabled() for b in panel.key_buttons)


@pytest.mark.timeout(120)
def test_download_failure_card(window, qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    with socket.socket() as s:  # a port nobody listens on: the hub cannot be reached
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    models = window.models_panel
    job = models.make_job("org/model", "", dead)
    view = models.downloads.itemAt(models.downloads.count() - 1).widget()
    job.start()
    qtbot.waitUntil(lambda: job.progress.state == FAILED, timeout=60_000)
    info = view.info.text()
    assert "Mirror endpoint" in info and "--endpoint" not in info and "HF_ENDPOINT" not in info
    assert "0 B / 0 B" not in info and "0%" not in info  # and the bar that would say it is hidden (below)
    assert view.info.wordWrap() and not view.total_bar.isVisible() and not view.file_bar.isVisible()
    assert view.resume_button.text() == "Retry"
    assert any("failed:" in window.logs.data(window.logs.index(i)) for i in range(window.logs.rowCount()))
    view.resume_button.click()
    assert "Retrying" in view.info.text()
    qtbot.waitUntil(lambda: job.progress.state == FAILED, timeout=60_000)
    view.dismiss_button.click()
    assert models.downloads.count() == 0 and not view.isVisible()


def test_log_lines_wrap_and_carry_one_timestamp(window):
    logs: LogModel = window.logs
    logs.add("server", "2026-12-03 10:00:00,123 INFO wslm.server: " + "a long line " * 30)
    logs.add("server", "[10:00:01] plain")
    shown = [logs.data(logs.index(i)) for i in range(logs.rowCount())][-2:]
    assert all(len([w for w in line.split() if w.count(":") == 2 and w[:2].isdigit()]) == 1 for line in shown)
    assert window.server_panel.log.list.wordWrap()


def test_quit_shortcut_and_close_with_the_server_running(window, monkeypatch):
    assert window.quit_action.shortcut().toString() == "Ctrl+Q"
    assert window.quit_action in window.menuBar().actions()[0].menu().actions()
    asked = []
    window.confirm_close = lambda: asked.append(1) or False  # the user says Cancel
    window.quit_action.trigger()
    assert asked and window.isVisible()


def test_narrow_window_and_collapsible_settings(window, qtbot):
    assert window.minimumSizeHint().width() <= 900  # was 1044
    chat = window.chat_panel
    chat.settings_button.click()
    assert not chat.params_box.isVisible() and window.settings.chat_settings_visible is False
    chat.settings_button.click()
    assert chat.params_box.isVisible()


def test_display_name_models_dir_and_combo_arrow(tmp_path, monkeypatch):
    assert display_name({"id": "demo", "format": "gguf", "name": "Smollm2 135M 8k Lc100K Mix1 Ep2",
                         "path": "/x/SmolLM2-135M-Instruct.Q4_1.gguf"}) == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert display_name({"id": "x", "repo_id": "Qwen/Qwen3-0.6B", "name": "Qwen3 0.6B"}) == "Qwen/Qwen3-0.6B"
    from wslm.paths import models_dir

    monkeypatch.delenv("WSLM_MODELS_DIR", raising=False)
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "cfg"))
    assert models_dir() == tmp_path / "cfg" / "models"
    from wslm.gui.theme import arrow_image, style_sheet

    assert f"QComboBox::down-arrow {{ image: url({arrow_image()})" in style_sheet()  # what apply_theme sets
    assert arrow_image().endswith(".png") and open(arrow_image(), "rb").read(4) == b"\x89PNG"


def test_doctor_names_the_missing_qt_xcb_libraries(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    have = ["libxcb-cursor.so.0", "libxcb-image.so.0", "libxcb-render-util.so.0", "libxcb-randr.so.0",
            "libxcb-shape.so.0", "libxcb-xfixes.so.0", "libxcb-xkb.so.1", "libxkbcommon-x11.so.0"]
    out = "".join(f"\t{lib} (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/{lib}\n" for lib in have)
    script = bin_dir / "ldconfig"
    script.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write({('N libs found in cache' + chr(10) + out)!r})\n")
    script.chmod(0o755)
    probe = Probe(root=tmp_path, env={"PATH": str(bin_dir)}, system="Linux")
    check = check_qt_xcb(probe, gui_installed=lambda: True)
    assert check.status == "warn" and check.data["missing"] == ["libxcb-icccm4", "libxcb-keysyms1"]
    assert "libxcb-icccm4" in check.detail and check.fix == "sudo apt-get install -y libxcb-icccm4 libxcb-keysyms1"
    assert check_qt_xcb(probe, gui_installed=lambda: False) is None  # no GUI extra: not our business
    assert check_qt_xcb(Probe(root=tmp_path, env={"PATH": str(bin_dir)}, system="Windows")) is None



def test_engine_options_are_fields_checked_before_start(window):
    panel = window.server_panel
    models = [{"id": "demo", "format": "gguf", "quantization": "Q4_1", "path": "/x/d.gguf", "num_kv_heads": 3},
              {"id": "org/llama", "format": "hf", "quantization": None, "num_kv_heads": 4,
               "num_attention_heads": 8, "intermediate_size": 128}]
    panel.set_models(models)
    assert not panel.tp.isVisible()  # one GPU or none: no tensor-parallel field
    panel.set_model("demo")
    panel.quantization.setCurrentIndex(panel.quantization.findData("int8"))
    panel.start_button.click()
    assert window.server.state == STOPPED and "GGUF" in panel.detail.text()  # refused, with the fix
    assert panel.quantization.styleSheet()
    panel.set_model("org/llama")
    panel.kv_dtype.setCurrentIndex(panel.kv_dtype.findData("fp8"))
    panel.gpu_unavailable("no GPU")
    assert panel.validate()  # an fp8 KV cache runs on CPU too
    panel.show_gpu({"gpu_util": 1.0, "vram_used_mib": 1.0, "vram_total_mib": 8192.0, "gpu_count": 4})
    assert not panel.tp.isHidden() and [panel.tp.itemData(i) for i in range(panel.tp.count())] == [1, 2, 4]
    panel.tp.setCurrentIndex(panel.tp.findData(4))
    assert panel.validate()
    args = panel.config().serve_args()
    assert args[args.index("--quantization") + 1] == "int8" and args[args.index("--kv-cache-dtype") + 1] == "fp8"
    assert args[args.index("--tensor-parallel-size") + 1] == "4"
    assert window.settings.quantization == "int8" and window.settings.tensor_parallel_size == 4
