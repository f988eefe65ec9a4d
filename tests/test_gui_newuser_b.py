"""What a new user hit in the desktop app (issue 24, items 6-13), each replayed on the real widgets: an
over-long message, the Download dialog's Enter and its failure card, Tab in the chat, stale cards and
labels, Share on Linux, quiet actions, the minimum window size, MiB/GiB."""

from __future__ import annotations

import pytest

pytest.importorskip("PySide6")

import test_gui_chat  # noqa: E402
from PySide6.QtCore import Qt, QUrl  # noqa: E402
from PySide6.QtGui import QContextMenuEvent  # noqa: E402
from PySide6.QtTest import QTest  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402
from test_gui_chat import FakeOpenAI  # noqa: E402

from wslm.gui.chat_store import ChatStore  # noqa: E402
from wslm.gui.context_fit import DROP_OLDEST, STOP, TRUNCATE_MIDDLE, fit_messages  # noqa: E402
from wslm.gui.download_job import FAILED, PullJob, PullProgress  # noqa: E402
from wslm.gui.main_window import MainWindow  # noqa: E402
from wslm.gui.server_controller import CRASHED, READY, STOPPED  # noqa: E402
from wslm.gui.settings import Settings  # noqa: E402

fake_server = test_gui_chat.fake_server  # the loopback OpenAI-style streamer, as a fixture here too

LONG = "TOO LONG " + "lorem ipsum dolor sit amet " * 400  # ~11 kB: more than the fake server's 2048 tokens


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


def send(window, qtbot, text: str, signal: str = "reply_finished") -> None:
    chat = window.chat_panel
    chat.input.setPlainText(text)
    with qtbot.waitSignal(getattr(window.session, signal), timeout=10_000):
        chat.send()


# 10. One over-long message must not make the chat unusable.
def test_an_over_long_message_no_longer_breaks_every_later_send(window, fake_server, qtbot):
    use_fake(window, fake_server)
    session = window.session
    send(window, qtbot, LONG, "reply_failed")  # the server refuses it (its context is 2048 tokens)
    failed = session.messages.messages()[-1]
    assert "too long" in failed.error and "Retry fits it" in failed.error
    # Before: every later send carried the long message again and failed the same way.
    send(window, qtbot, "A short question")
    reply = session.messages.messages()[-1]
    assert not reply.error and reply.content == "".join(test_gui_chat.WORDS)
    sent = FakeOpenAI.requests[-1]["messages"]
    assert sent == [{"role": "user", "content": "A short question"}]  # the oldest message was left out
    assert "1 earlier message left out" in reply.stats["context_note"]
    window.chat_panel.view.render()
    assert "left out to fit the context" in window.chat_panel.view.toPlainText()  # said under the reply


def test_context_policy_is_a_setting_and_stop_says_why(window, fake_server, qtbot):
    use_fake(window, fake_server)
    chat, session = window.chat_panel, window.session
    assert chat.overflow.currentData() == DROP_OLDEST and session.overflow_policy == DROP_OLDEST  # the default
    chat.overflow.setCurrentIndex(chat.overflow.findData(STOP))
    assert window.settings.chat_context_overflow == STOP and session.overflow_policy == STOP
    chat.set_server("", "", "")  # (not our server: the context is what the server said, learnt below)
    session._learned_context[(session.base_url, session.model)] = 2048
    FakeOpenAI.requests.clear()
    send(window, qtbot, LONG, "reply_failed")
    assert not FakeOpenAI.requests  # nothing was sent
    assert "longer than the model's context" in session.messages.messages()[-1].error


def test_fit_policies():
    big = "x" * 6000
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "first"},
               {"role": "assistant", "content": big}, {"role": "user", "content": "second"},
               {"role": "assistant", "content": "ok"}, {"role": "user", "content": "third"}]
    assert fit_messages(history, None, 256).messages == history  # unknown context: as is
    assert fit_messages(history, 100_000, 256).messages == history  # fits: as is
    fit = fit_messages(history, 2048, 1024, DROP_OLDEST)
    assert [m["content"] for m in fit.messages] == ["Be brief.", "second", "ok", "third"]
    assert "2 earlier messages left out" in fit.note
    fit = fit_messages(history, 2048, 1024, TRUNCATE_MIDDLE)
    assert [m["content"] for m in fit.messages] == ["Be brief.", "first", "second", "ok", "third"]
    assert fit_messages(history, 2048, 1024, STOP).messages is None
    one = [{"role": "user", "content": "start " + "y" * 20000 + " end"}]  # the newest alone is too long
    fit = fit_messages(one, 2048, 1024, DROP_OLDEST)
    text = fit.messages[0]["content"]
    assert text.startswith("start") and text.endswith("end") and "characters left out" in text
    assert len(text.encode()) / 2 < 2048 and "cut from the middle" in fit.note


def test_delete_a_message(window, fake_server, qtbot):
    use_fake(window, fake_server)
    session, chat = window.session, window.chat_panel
    send(window, qtbot, "Hello")
    chat.view.render()
    assert "delete:0" in chat.view.toHtml() and "delete:1" in chat.view.toHtml()
    conv_id = session.messages.conversation_id
    chat.view.anchorClicked.emit(QUrl("delete:0"))
    assert [m.role for m in session.messages.messages()] == ["assistant"]
    assert [m.role for m in session.store.messages(conv_id)] == ["assistant"]  # gone from the store too


# 6. The Download dialog: Enter downloads; the failure card is whole.
class FailingJob(PullJob):
    """Fails at once with a long reason (what a hub that cannot be reached says), no subprocess."""

    def start(self) -> None:
        self.progress = PullProgress(state=FAILED, message="Could not reach the hub at https://huggingface.co: "
                                     "the connection timed out. " * 4)
        self.changed.emit()
        self.finished.emit(FAILED)


def test_enter_in_the_download_dialog_downloads(window, qtbot, monkeypatch):
    models = window.models_panel
    jobs = []

    def make_job(repo, pattern, endpoint):
        jobs.append(FailingJob(models.service.target, repo, pattern, endpoint, parent=models))
        return jobs[-1]

    monkeypatch.setattr(models, "make_job", make_job)
    dialog = models.open_download()
    qtbot.waitExposed(dialog)
    QTest.keyClicks(dialog.repo, "org/model")
    QTest.keyClick(dialog.repo, Qt.Key.Key_Return)
    assert jobs and jobs[0].repo == "org/model" and dialog.isVisible()  # before: closed, nothing downloaded
    view = dialog.progress_view
    qtbot.wait(50)
    assert view.resume_button.text() == "Retry"
    # Nothing clipped: the card is as tall as its wrapped reason and its buttons need ("Retrv").
    assert view.resume_button.height() >= view.resume_button.sizeHint().height()
    assert view.info.height() >= view.info.heightForWidth(view.info.width())
    assert view.height() >= view.minimumSizeHint().height()
    dialog.close()


# 7. Tab moves between controls.
def test_tab_moves_focus_in_the_chat(window, fake_server, qtbot):
    use_fake(window, fake_server)
    chat = window.chat_panel
    send(window, qtbot, "Hello")
    chat.view.render()
    window.activateWindow()
    chat.input.setFocus()
    chat.input.setPlainText("draft")
    QTest.keyClick(chat.input, Qt.Key.Key_Tab)
    assert chat.input.toPlainText() == "draft" and QApplication.focusWidget() is not chat.input  # no tab char
    chat.system_prompt.setFocus()
    QTest.keyClick(chat.system_prompt, Qt.Key.Key_Tab)
    assert "\t" not in chat.system_prompt.toPlainText()
    # From the search box, Tab walks the transcript's links (Copy, Edit, Delete; Copy, Regenerate, Delete:
    # issue 34 wants them reachable by keyboard) and then goes on to the message box: never stuck there.
    chat.search.setFocus()
    links = []
    for _ in range(20):
        focus = QApplication.focusWidget()
        if focus is chat.input:
            break
        if focus is chat.view and chat.view.textCursor().hasSelection():
            links.append(chat.view.textCursor().charFormat().anchorHref())
        QTest.keyClick(focus, Qt.Key.Key_Tab)
    assert QApplication.focusWidget() is chat.input
    assert links[:3] == ["copy:0", "edit:0", "delete:0"] and "regen:1" in links, links


# 11. Stale pickers, titles, highlights, logs and cards.
def test_picker_shows_what_start_loads_after_a_failed_switch(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    store = ChatStore(tmp_path / "chats.sqlite3")
    w = MainWindow(Settings(first_run_done=True, port=8123, chat_use_server=True), store, watch=False)
    qtbot.addWidget(w)
    started = []
    monkeypatch.setattr(w.server_panel, "start", lambda: started.append(w.server_panel.model_id()))
    models = [{"id": "small", "format": "gguf", "path": "/m/small.gguf"},
              {"id": "big", "format": "gguf", "path": "/m/big.gguf"}]
    w.server_panel.set_models(models)
    w.server_panel.set_model("small")
    w.chat_panel.set_installed_models(models, "small")
    chat = w.chat_panel
    chat.choose_model("big")  # the user picks another model in the chat: the switch starts it
    assert started == ["big"]
    w.server.state_changed.emit(CRASHED, "The GPU ran out of memory. Lower “GPU memory share”.")
    # The picker shows what the Server panel would start (the model that failed), not the last listing's.
    assert chat.model_combo.currentData() == "big" == w.server_panel.model_id()
    w.server_panel.set_model("small")  # the user goes back to the small one in the Server panel
    assert chat.model_combo.currentData() == "small"
    w.session.shutdown()
    w.close()
    store.close()


def test_rename_updates_the_header_and_right_click_keeps_the_highlight(window, qtbot):
    chat, session = window.chat_panel, window.session
    session.new_conversation()
    session.messages.append("user", "x")
    session.new_conversation()  # two chats; the newest (row 0) is open
    model = session.conversations
    assert model.setData(model.index(0), "Renamed chat")  # what the list's rename box does
    assert chat.title.text() == "Renamed chat"  # the header followed
    menus = []
    chat.list.customContextMenuRequested.disconnect()  # (a real menu would block the test in its exec())
    chat.list.customContextMenuRequested.connect(menus.append)
    open_id = session.messages.conversation_id
    pos = chat.list.visualRect(model.index(1)).center()
    viewport = chat.list.viewport()
    QTest.mouseClick(viewport, Qt.MouseButton.RightButton, Qt.KeyboardModifier.NoModifier, pos)
    QApplication.sendEvent(viewport, QContextMenuEvent(QContextMenuEvent.Reason.Mouse, pos, viewport.mapToGlobal(pos)))
    assert menus and session.messages.conversation_id == open_id  # the menu still comes
    assert chat.list.currentIndex().row() == model.row_of(open_id)  # the highlight stayed on the open chat


def test_server_log_follows_new_lines(window, qtbot):
    log = window.server_panel.log
    bar = log.list.verticalScrollBar()
    window.sidebar.select("chat")  # lines arrive while another panel is shown
    for i in range(300):
        window.logs.add("server", f"line {i} " + "word " * (i % 40))
    window.sidebar.select("server")

    def at_end() -> bool:  # (laid out to the last line: the range grows in batches of 200 rows)
        return bar.maximum() >= log.proxy.rowCount() - 60 and bar.value() == bar.maximum()

    qtbot.waitUntil(at_end, timeout=3000)
    for i in range(300):  # a burst while it is shown
        window.logs.add("server", f"more {i} " + "word " * (i % 40))
    qtbot.waitUntil(at_end, timeout=3000)
    bar.triggerAction(bar.SliderAction.SliderPageStepSub)  # the user scrolls up to read: it stays there
    qtbot.wait(20)
    kept = bar.value()
    window.logs.add("server", "one more line")
    qtbot.wait(200)  # (the list lays itself out again in batches)
    assert bar.value() == kept < bar.maximum() and not log.following


def test_cards_and_status_do_not_go_stale(window, qtbot):
    from wslm.gui.crash_hints import CrashCause

    panel, server = window.server_panel, window.server
    # The port-taken card goes once the Port field is changed.
    server.cause = CrashCause("The port is taken", "Change “Port” above.", "port")
    server.state = CRASHED
    server.state_changed.emit(CRASHED, "The port is taken. Change “Port” above.")
    assert not panel.crash_box.isHidden() and panel.port.styleSheet()
    panel.port.setValue(panel.port.value() + 1)
    assert panel.crash_box.isHidden() and not panel.port.styleSheet()
    server.state = STOPPED
    # The model detail card follows a Refresh.
    models = window.models_panel
    table = window.models.table
    table.set_models([{"id": "a", "path": "/m/a", "memory_estimate_bytes": 1 << 30},
                      {"id": "b", "path": "/m/b", "memory_estimate_bytes": 2 << 30}])
    models.table.selectRow(1)
    assert "2.0 GiB" in models.details.text()
    table.set_models([{"id": "a", "path": "/m/a", "memory_estimate_bytes": 1 << 30},
                      {"id": "b", "path": "/m/b", "memory_estimate_bytes": 3 << 30}])  # Refresh: new estimate
    assert "3.0 GiB" in models.details.text() and models.selected_model()["id"] == "b"
    table.set_models([{"id": "a", "path": "/m/a"}])  # b was deleted elsewhere
    assert "/m/b" not in models.details.text() and "Select a model" in models.details.text()
    # The status bar does not put a custom URL's speed beside our server's "Model: demo" unlabelled.
    server.state = READY
    window.session.reply_finished.emit({"tokens_per_s": 42.0, "model": "gpt-x"})
    assert "gpt-x" in window.status.speed.text() and "not this server" in window.status.speed.text()
    server.state = STOPPED


# 13. Share on Linux, quiet actions, "Crashed" for a failure to start.
def test_share_on_linux_is_visibly_off(window, monkeypatch):
    from wslm.wsl_bridge import winexec

    monkeypatch.setattr(winexec, "is_windows", lambda: False)
    window._watch_share()
    panel = window.share_panel
    for w in (panel.switch, panel.refresh_button):
        assert not w.isEnabled() and "Windows hosts" in w.toolTip()
    window.share.busy_changed.emit(False)  # the end of some share call must not re-enable them
    assert not panel.switch.isEnabled() and not panel.refresh_button.isEnabled()


def test_export_copy_and_an_empty_download_say_something(window, fake_server, qtbot, tmp_path):
    use_fake(window, fake_server)
    chat, session = window.chat_panel, window.session
    send(window, qtbot, "Hello")
    chat.export_chat(session.messages.conversation_id, str(tmp_path / "chat.md"))
    assert "Exported" in window.status.currentMessage() and (tmp_path / "chat.md").exists()
    session.messages.append("assistant", "Run:\n```sh\necho hi\n```")
    chat.view.anchorClicked.emit(QUrl(f"copycode:{session.messages.rowCount() - 1}:0"))
    assert QApplication.clipboard().text() == "echo hi" and "copied" in window.status.currentMessage()
    dialog = window.models_panel.open_discover()
    dialog.download_button.click()  # nothing searched yet
    assert "search for a model" in dialog.status.text()
    dialog.close()


def test_a_failure_to_start_is_not_called_a_crash(window):
    panel, server = window.server_panel, window.server
    server.state_changed.emit("starting", "Starting…")
    server.state_changed.emit(CRASHED, "The server stopped unexpectedly. exit code 1")
    assert panel.badge.text() == "Failed to start" and "failed to start" in window.status.state.text()
    assert "failed to start" in panel.crash_box.text() and "Crashed" not in panel.badge.text()
    server.state_changed.emit("starting", "Starting…")
    server.state_changed.emit(READY, "demo")
    server.state_changed.emit(CRASHED, "The server stopped unexpectedly. exit code 1")
    assert panel.badge.text() == "Crashed"  # it ran, then stopped: that is a crash


# 8. A 1366x768 laptop fits the window.
def test_minimum_window_size_fits_a_small_laptop(qtbot, tmp_path, monkeypatch):
    from wslm.gui.theme import apply_theme

    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    app = QApplication.instance()
    saved = (app.style().name(), app.styleSheet(), app.palette(), app.font())
    apply_theme(app)  # the real app's sizes (padding, fonts) are what count
    store = ChatStore(tmp_path / "chats.sqlite3")
    try:
        w = MainWindow(Settings(first_run_done=True, chat_use_server=False), store, watch=False)
        qtbot.addWidget(w)
        w.show()
        qtbot.waitExposed(w)
        hint = w.minimumSizeHint()
        assert hint.width() <= 800 and hint.height() <= 600  # was 887 x 699
        conv = w.session.new_conversation()
        w.session.conversations.rename(w.session.conversations.row_of(conv.id), "My first chat about fonts")
        w.chat_panel._on_current(conv.id)
        w.resize(hint)
        qtbot.wait(50)
        chat = w.chat_panel
        shown = chat.title.shown_text()
        assert len(shown.rstrip("…")) >= 5, shown  # was "M…"
        assert chat.list.viewport().width() >= 110  # the chat list keeps ~15 characters
        w.session.shutdown()
        w.close()
    finally:
        store.close()
        app.setStyle(saved[0])
        app.setStyleSheet(saved[1])
        app.setPalette(saved[2])
        app.setFont(saved[3])


# 12. Sizes in binary units, named as such.
def test_sizes_are_mib_and_gib():
    from wslm.gui.format import human_bytes

    assert human_bytes(512 * 2**20) == "512.0 MiB" and human_bytes(3 * 2**30) == "3.0 GiB"
    assert human_bytes(2048) == "2.0 KiB" and "MB" not in human_bytes(5 * 10**6)
