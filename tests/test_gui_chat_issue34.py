"""Issue 34's chat-side bugs, each reproduced on real widgets (offscreen) as a user meets it, against the
loopback OpenAI-style streamer: the mouse wheel over the chat settings (4), keyboard focus and Tab (7), the
header chip while the server loads (8), the smallest window (9), a question left without a reply (10), the
picker, the context meter, New chat and the switch hint (11); presets that carry sampling and the developer
view's request history (what to build)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("PySide6")

import test_gui_chat  # noqa: E402
from PySide6.QtCore import QPoint, QPointF, Qt, QUrl  # noqa: E402
from PySide6.QtGui import QWheelEvent  # noqa: E402
from PySide6.QtTest import QTest  # noqa: E402
from PySide6.QtWidgets import QApplication, QWidget  # noqa: E402
from test_gui_chat import FakeOpenAI  # noqa: E402

from wslm.gui.chat_panel import ChatPanel  # noqa: E402
from wslm.gui.chat_session import ChatSession  # noqa: E402
from wslm.gui.chat_store import ChatStore  # noqa: E402
from wslm.gui.main_window import MainWindow  # noqa: E402
from wslm.gui.model_picker import DetailsRole  # noqa: E402
from wslm.gui.settings import Settings  # noqa: E402

fake_server = test_gui_chat.fake_server  # the loopback OpenAI-style streamer, as a fixture here too


@pytest.fixture
def themed():
    """The real app's look (padding, fonts, focus rings); the default style is put back afterwards."""
    from wslm.gui.theme import apply_theme

    app = QApplication.instance()
    saved = (app.style().name(), app.styleSheet(), app.palette(), app.font())
    apply_theme(app)
    yield app
    app.setStyle(saved[0])
    app.setStyleSheet(saved[1])
    app.setPalette(saved[2])
    app.setFont(saved[3])


@pytest.fixture
def panel(qtbot, tmp_path, fake_server):
    store = ChatStore(tmp_path / "chats.sqlite3")
    session = ChatSession(store, {"system_prompt": ""})
    settings = Settings(chat_use_server=False, chat_base_url=fake_server, chat_model="demo", chat_api_key="sk-test",
                        system_prompt="")
    p = ChatPanel(session, settings)
    qtbot.addWidget(p)
    p.resize(1100, 700)
    p.show()
    qtbot.waitExposed(p)
    yield p
    session.shutdown()
    store.close()


@pytest.fixture
def server_panel(qtbot, tmp_path):
    """A chat panel in wslm-server mode, no server running (the main window sets the rest)."""
    store = ChatStore(tmp_path / "chats.sqlite3")
    session = ChatSession(store, {"system_prompt": ""})
    p = ChatPanel(session, Settings(chat_use_server=True, port=8123, system_prompt=""))
    qtbot.addWidget(p)
    p.show()
    yield p
    session.shutdown()
    store.close()


def ask(panel, qtbot, text: str) -> None:
    panel.input.setPlainText(text)
    with qtbot.waitSignal(panel.session.reply_finished, timeout=10_000):
        panel.send()


def wheel(widget: QWidget, steps: int = -1) -> None:
    """One notch of the mouse wheel over the middle of `widget` (negative: towards the user, scrolling down)."""
    pos = QPointF(widget.width() / 2, widget.height() / 2)
    event = QWheelEvent(pos, QPointF(widget.mapToGlobal(pos.toPoint())), QPoint(0, 0), QPoint(0, 120 * steps),
                        Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)
    QApplication.sendEvent(widget, event)


# 4. The wheel over the chat settings scrolls the column; it changes a value only in the box being edited.
def test_wheel_over_the_settings_scrolls_instead_of_changing_values(panel, qtbot):
    panel.window().resize(1100, 420)  # a short window: the settings column scrolls
    qtbot.waitUntil(lambda: panel.params_box.verticalScrollBar().maximum() > 0)
    bar = panel.params_box.verticalScrollBar()
    policy, temperature = panel.overflow.currentIndex(), panel.temperature.value()
    panel.input.setFocus()
    for box in (panel.overflow, panel.temperature, panel.max_tokens, panel.reasoning):
        wheel(box)
    assert panel.overflow.currentIndex() == policy and panel.temperature.value() == temperature  # was flipped
    assert bar.value() > 0  # the column scrolled instead
    # Clicked into (it has the focus): the wheel edits it, as the user now means.
    panel.temperature.setFocus()
    wheel(panel.temperature, steps=1)
    assert panel.temperature.value() > temperature
    assert panel.session.current() is None or panel.session.current().temperature == panel.temperature.value()


# 7. Keyboard: a visible focus ring on Send, ⚙, 📎, the chat list and Start; the links reachable by Tab.
def test_focus_rings_and_the_links_in_the_tab_order(qtbot, tmp_path, monkeypatch, themed, fake_server):
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    store = ChatStore(tmp_path / "chats.sqlite3")
    w = MainWindow(Settings(first_run_done=True, port=8123, system_prompt="", chat_use_server=False,
                            chat_base_url=fake_server, chat_model="demo", chat_api_key="sk-test"), store, watch=False)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    w.activateWindow()
    chat = w.chat_panel
    ask(chat, qtbot, "Hello")
    chat.view.render()

    def ring_shows(widget: QWidget, page: str = "chat") -> bool:
        w.show_panel(page)
        QApplication.processEvents()
        chat.input.setFocus()
        widget.clearFocus()
        QApplication.processEvents()
        before = widget.grab().toImage()
        widget.setFocus(Qt.FocusReason.TabFocusReason)
        QApplication.processEvents()
        assert widget.hasFocus()
        return widget.grab().toImage() != before

    for widget in (chat.send_button, chat.settings_button, chat.attach_button, chat.list):
        assert widget.focusPolicy() & Qt.FocusPolicy.TabFocus, widget
        assert ring_shows(widget), widget
    assert ring_shows(w.server_panel.start_button, "server")
    w.show_panel("chat")
    # A mouse click on Send leaves the keyboard in the message box (the focus policy is Tab only).
    assert not chat.send_button.focusPolicy() & Qt.FocusPolicy.ClickFocus

    # Copy, Edit, Regenerate and ‹ 1/2 › are reached with Tab (and followed with Enter).
    with qtbot.waitSignal(w.session.reply_finished, timeout=10_000):
        chat._regenerate(1)  # a second reply: ‹ 2/2 › on it
    chat.view.render()
    chat.search.setFocus()
    links = []
    for _ in range(30):
        focus = QApplication.focusWidget()
        if focus is chat.input:
            break
        if focus is chat.view and chat.view.textCursor().hasSelection():
            links.append(chat.view.textCursor().charFormat().anchorHref())
        QTest.keyClick(focus, Qt.Key.Key_Tab)
    assert {"copy:0", "edit:0", "ver:1:0", "copy:1", "regen:1"} <= set(links), links
    # Back with Shift+Tab to the previous branch's link, and Enter follows it: the first reply shows.
    chat.view.setFocus(Qt.FocusReason.TabFocusReason)
    while chat.view.textCursor().charFormat().anchorHref() != "ver:1:0":
        QTest.keyClick(chat.view, Qt.Key.Key_Tab)
    QTest.keyClick(chat.view, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: w.session.messages.message(1).content == "".join(test_gui_chat.WORDS)
                    and "1/2" in chat.view.toPlainText())

    # The note's "start it" link: Shift+Tab from the message box reaches it, Enter takes the offer.
    chat.use_server.setChecked(True)
    starts = []
    chat.start_server_requested.connect(lambda: starts.append(True))
    chat.input.setPlainText("are you there?")
    chat.send()
    assert "start it" in chat.error_label.text()
    chat.input.setFocus()
    for _ in range(5):
        if QApplication.focusWidget() is chat.error_label:
            break
        QTest.keyClick(QApplication.focusWidget(), Qt.Key.Key_Backtab)
    assert QApplication.focusWidget() is chat.error_label
    QTest.keyClick(chat.error_label, Qt.Key.Key_Return)
    assert starts == [True]
    w.session.shutdown()
    w.close()
    store.close()


# 8. While our server starts and loads, the chip beside the picker says so (the title bar and banner do).
def test_the_header_chip_says_loading_while_the_server_loads(server_panel):
    chip = server_panel.connection_label
    assert "server not running" in chip.text()
    server_panel.set_server_state("starting", True)
    assert "starting…" in chip.text() and "not running" not in chip.text()
    server_panel.set_server_state("loading", True)
    assert "loading…" in chip.text()
    assert "getting ready" in server_panel.view.empty_hint
    server_panel.set_server("http://127.0.0.1:8123/v1", "demo", "")
    server_panel.set_server_state("ready", False)
    assert "wslm server" in chip.text()
    server_panel.set_server("", "", "")
    server_panel.set_server_state("stopped", False)
    assert "server not running" in chip.text()


# 9. At the smallest window the Models table shows names and the chat settings are not cut off.
def test_the_smallest_window_shows_model_names_and_whole_settings(qtbot, tmp_path, monkeypatch, themed):
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    store = ChatStore(tmp_path / "chats.sqlite3")
    w = MainWindow(Settings(first_run_done=True, chat_use_server=False), store, watch=False)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    w.resize(w.minimumSizeHint())
    qtbot.wait(50)
    chat = w.chat_panel
    # The settings column: every control inside its viewport, "Save…" as wide as its text.
    inner = chat.params_box.widget()
    assert inner.width() <= chat.params_box.viewport().width()
    for widget in inner.findChildren(QWidget):
        if widget.isVisible() and widget.parentWidget() is not None:
            right = widget.mapTo(inner, QPoint(widget.width(), 0)).x()
            assert right <= inner.width(), (type(widget).__name__, right, inner.width())
    assert chat.preset_save.width() >= chat.preset_save.sizeHint().width()  # "Save…", not "Sa"

    # The Models table with real-looking rows: the names keep their room, cut in the middle if at all.
    w.show_panel("models")
    models = [{"id": f"Qwen2.5-{n}B-Instruct-GGUF", "architecture": "Qwen2ForCausalLM", "num_params": n * 10**9,
               "format": "gguf", "quantization": "Q4_K_M", "size_bytes": n * 6 * 10**8, "context_length": 32768,
               "source": "hf"} for n in (1, 3, 7)]
    w.models.table.set_models(models)
    qtbot.wait(50)
    table = w.models_panel.table
    name_w = table.horizontalHeader().sectionSize(0)
    assert name_w >= 0.3 * table.viewport().width()
    fm = table.fontMetrics()
    shown = fm.elidedText(models[0]["id"], Qt.TextElideMode.ElideMiddle, name_w - 16)
    assert len(shown.replace("…", "")) >= 12, shown  # was "…" for every name
    w.resize(1400, 800)
    qtbot.wait(50)
    assert table.horizontalHeader().sectionSize(0) >= fm.horizontalAdvance(models[0]["id"])  # room enough: whole
    w.session.shutdown()
    w.close()
    store.close()


# 10. A question left without a reply (its reply deleted) can be answered: Regenerate on it, or empty Send.
def test_a_question_without_a_reply_can_be_answered(panel, qtbot):
    ask(panel, qtbot, "Hello")
    panel.delete_message(1)  # the reply goes
    panel.view.render()
    assert [m.role for m in panel.session.messages.messages()] == ["user"]
    assert "regen:0" in panel.view.toHtml()  # Regenerate under the question
    with qtbot.waitSignal(panel.session.reply_finished, timeout=10_000):
        panel.view.anchorClicked.emit(QUrl("regen:0"))  # as a click on it does
    assert [m.role for m in panel.session.messages.messages()] == ["user", "assistant"]
    assert FakeOpenAI.requests[-1]["messages"][-1] == {"role": "user", "content": "Hello"}
    # Again without a reply: Send with an empty message box answers it.
    panel.delete_message(1)
    panel.input.clear()
    with qtbot.waitSignal(panel.session.reply_finished, timeout=10_000):
        panel.send()
    assert [m.role for m in panel.session.messages.messages()] == ["user", "assistant"]
    assert len(FakeOpenAI.requests) == 3
    # With the reply there, an empty Send does nothing (nothing to answer).
    panel.send()
    assert len(FakeOpenAI.requests) == 3 and not panel.session.busy


# 11. The context meter counts the draft and the attached files.
def test_the_context_meter_counts_the_draft_and_attachments(panel, qtbot, tmp_path):
    ask(panel, qtbot, "Hello")
    panel.session.context_len = 4096
    panel.update_context_meter()

    def used() -> int:
        text = panel.context_meter.text().lstrip("≈").split("/")[0].strip()
        return int(float(text[:-1]) * 1000) if text.endswith("k") else int(text.split()[0])

    before = used()
    panel.input.setPlainText("word " * 400)  # ~2,000 bytes: ~500 tokens
    assert used() >= before + 400
    panel.input.clear()
    assert used() == before
    doc = tmp_path / "notes.md"
    doc.write_text("The launch code is 4711. " * 120)  # ~3,000 bytes: goes whole
    panel.attach_files([str(doc)])
    qtbot.waitUntil(lambda: any(a.status == "whole" for a in panel.attachments.model.attachments()), timeout=10_000)
    tokens = next(a.tokens for a in panel.attachments.model.attachments())
    assert tokens > 0 and used() >= before + tokens - 1
    assert "attached files" in panel.context_meter.toolTip()


# 11. The picker cuts a long name with "…" and describes a browsed file (size, quantization, context).
def test_the_picker_elides_names_and_describes_a_browsed_file(server_panel, qtbot):
    from wslm.demo import demo_model_path

    assert server_panel.model_combo.shown_text() == "no model"  # the placeholder, while none is installed
    long_id = "Meta-Llama-3.1-8B-Instruct-abliterated-uncensored-Q4_K_M"
    server_panel.set_installed_models([{"id": long_id, "quantization": "Q4_K_M"}], serve_choice=long_id)
    combo = server_panel.model_combo
    combo.setFixedWidth(160)
    shown = combo.shown_text()
    assert "…" in shown and shown.startswith("Meta") and shown.endswith(long_id[-3:])
    combo.grab()  # paints without errors
    gguf = str(demo_model_path())
    server_panel.choose_model_file = lambda: gguf
    server_panel._model_chosen(combo.count() - 1)
    i = combo.findData(gguf)
    assert i >= 0 and "Q4_1" in combo.itemData(i, DetailsRole) and "MiB" in combo.itemData(i, DetailsRole)
    # The header is read off the GUI thread: the context follows.
    qtbot.waitUntil(lambda: "8,192 ctx" in (combo.itemData(combo.findData(gguf), DetailsRole) or ""), timeout=30_000)


# 11. New chat reuses an empty chat and carries the last chat's parameters; the switch hint tells the truth.
def test_new_chat_reuses_the_empty_one_and_keeps_the_parameters(panel, qtbot, tmp_path):
    session = panel.session
    ask(panel, qtbot, "first")
    first = session.current().id
    panel.temperature.setValue(0.3)
    panel.top_k.setValue(40)
    panel.system_prompt.setPlainText("Be brief.")
    panel.new_chat()
    empty = session.current().id
    conv = session.current()
    assert empty != first and (conv.temperature, conv.top_k, conv.system_prompt) == (0.3, 40, "Be brief.")
    assert panel.temperature.value() == 0.3 and panel.top_k.value() == 40  # carried over, not reset
    # Back to the first chat, then New chat again: the empty one is reused, not a second one piled up.
    session.open(first)
    panel.temperature.setValue(0.5)
    panel.new_chat()
    assert session.current().id == empty and session.conversations.rowCount() == 2
    assert session.current().temperature == 0.5 and panel.chat_list.list.currentIndex().row() == 0
    panel.new_chat()
    assert session.current().id == empty and session.conversations.rowCount() == 2
    # An empty chat with a file attached is kept for that file: New chat starts another one.
    doc = tmp_path / "plan.md"
    doc.write_text("A plan.")
    panel.attach_files([str(doc)])
    session.open(first)
    panel.new_chat()
    assert session.current().id not in (empty, first) and session.conversations.rowCount() == 3


def test_the_switch_hint_says_the_server_reloads_only_when_it_does(server_panel):
    p = server_panel
    p.set_installed_models([{"id": "demo"}, {"id": "tiny"}], serve_choice="demo")
    p.set_server("http://127.0.0.1:8123/v1", "demo", "")
    conv = p.session.new_conversation()
    p.session.store.update_conversation(conv.id, model="tiny")
    p.live_switch = lambda model_id: True  # the server's model pool loads it beside the running one
    p._on_current(conv.id)
    assert not p.model_hint.isHidden() and "reloads" not in p.model_hint.text()
    p.live_switch = lambda model_id: False  # no pool: a switch restarts the server
    p._show_model_hint()
    assert "(the server reloads)" in p.model_hint.text()
    p.set_server("", "", "")  # not running: a start, not a reload
    p._show_model_hint()
    assert "reloads" not in p.model_hint.text()


# What to build: presets carry the sampling too, as LM Studio's do.
def test_presets_carry_the_sampling_parameters(panel, qtbot):
    store = panel.session.store
    ask(panel, qtbot, "hi")
    panel.system_prompt.setPlainText("You are exact.")
    panel.temperature.setValue(0.15)
    panel.top_k.setValue(20)
    panel.max_tokens.setValue(256)
    panel.seed.setValue(7)
    panel.save_preset("Exact")
    assert store.presets() == {"Exact": "You are exact."}
    assert store.preset_params("Exact")["temperature"] == 0.15 and store.preset_params("Exact")["top_k"] == 20
    assert panel.preset_combo.currentData() == "Exact"
    panel.temperature.setValue(0.9)
    assert panel.preset_combo.currentData() == ""  # a parameter edited away from it: Custom
    panel.new_chat()
    panel.temperature.setValue(1.1)
    panel.top_k.setValue(0)
    panel._preset_chosen(panel.preset_combo.findData("Exact"))
    conv = panel.session.current()
    assert (conv.system_prompt, conv.temperature, conv.top_k, conv.max_tokens, conv.seed) == (
        "You are exact.", 0.15, 20, 256, 7)
    ask(panel, qtbot, "go")
    body = FakeOpenAI.requests[-1]
    assert body["messages"][0] == {"role": "system", "content": "You are exact."}
    assert body["temperature"] == 0.15 and body["top_k"] == 20 and body["seed"] == 7 and body["max_tokens"] <= 256
    # A preset saved before presets had parameters (the old column empty) still gives its prompt.
    store.save_preset("Old", "Old prompt.")
    assert store.preset_params("Old") == {}
    panel.params.fill_presets()
    panel._preset_chosen(panel.preset_combo.findData("Old"))
    assert panel.session.current().system_prompt == "Old prompt." and panel.session.current().temperature == 0.15


# What to build: the developer view keeps the requests sent (last 50), each with its exact prompt.
def test_developer_view_history_shows_each_request_as_sent(panel, qtbot, tmp_path):
    doc = tmp_path / "facts.md"
    doc.write_text("The vault number is 93017.\n")
    ask(panel, qtbot, "first question")
    panel.attach_files([str(doc)])
    qtbot.waitUntil(lambda: any(a.status == "whole" for a in panel.attachments.model.attachments()), timeout=10_000)
    ask(panel, qtbot, "what is the vault number?")
    entries = panel.history.for_conversation(panel.session.messages.conversation_id)
    assert len(entries) == 2 and all(e.ended for e in entries)
    newest = entries[0]
    assert newest.body == FakeOpenAI.requests[-1]  # exactly what went out
    assert "93017" in json.dumps(newest.body)  # the attached file's text, in the request
    dialog = panel.dev_view()
    qtbot.addWidget(dialog)
    assert dialog.history_list.count() == 2
    dialog.history_list.setCurrentRow(0)
    assert "93017" in dialog.history_prompt.toPlainText() and "what is the vault number?" in dialog.history_prompt.toPlainText()
    assert json.loads(dialog.history_body.toPlainText()) == newest.body
    assert "Completion tokens" in dialog.history_stats.toPlainText() and "Time to first token" in dialog.history_stats.toPlainText()
    assert "in ·" in dialog.history_list.item(0).text() or "out" in dialog.history_list.item(0).text()
    # The last 50 only.
    for i in range(60):
        panel.session.request_sent.emit(panel.session.messages.conversation_id, 10_000 + i, {"model": "x", "i": i})
    entries = panel.history.for_conversation(panel.session.messages.conversation_id)
    assert len(panel.history.entries) == 50 and entries[0].body["i"] == 59


# 11. Context length can be cleared back to "model default" (the field refused an empty value).
def test_context_length_can_be_cleared_back_to_model_default(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    store = ChatStore(tmp_path / "chats.sqlite3")
    w = MainWindow(Settings(first_run_done=True, max_model_len=4096, chat_use_server=False), store, watch=False)
    qtbot.addWidget(w)
    w.show()
    w.show_panel("server")
    box = w.server_panel.context
    box.setFocus()
    box.selectAll()
    QTest.keyClick(box, Qt.Key.Key_Delete)
    QTest.keyClick(box, Qt.Key.Key_Return)
    w.server_panel.port.setFocus()
    assert box.value() == 0 and box.text() == "model default"
    assert w.settings.max_model_len == 0  # the server starts with the model's own context
    w.session.shutdown()
    w.close()
    store.close()


# Hooks for other parts (MCP tool calls): a card under a message, with links of its own.
def test_the_transcript_shows_cards_from_other_parts(panel, qtbot):
    from wslm.gui.chat_view import card_html

    ask(panel, qtbot, "Hello")
    clicked = []
    panel.view.add_message_part(lambda row, msg, streaming: card_html(
        "Tool call: get_time", "<code>{}</code>", "warn", f'<a href="allow:{row}">Allow once</a>')
        if msg.role == "assistant" else "")
    panel.view.add_link_handler("allow", clicked.append)
    panel.view.render()
    assert "Tool call: get_time" in panel.view.toPlainText() and "Allow once" in panel.view.toPlainText()
    panel.view.anchorClicked.emit(QUrl("allow:1"))
    assert clicked == ["1"]


def test_gguf_header_reader(tmp_path):
    from wslm.demo import demo_model_path
    from wslm.gui.gguf_header import read_header

    assert read_header(str(demo_model_path())) == {"quantization": "Q4_1", "context_length": 8192}
    other = tmp_path / "notes.gguf"
    other.write_bytes(b"not a gguf file")
    assert read_header(str(other)) == {}


def test_other_parts_can_say_something_under_the_transcript(panel):
    panel.show_problem("notes.md was left out: it does not fit the context <4k>")
    assert panel.error_label.isVisible() and "&lt;4k&gt;" in panel.error_label.text()  # plain text, escaped
    panel.clear_note()
    assert panel.error_label.isHidden()
