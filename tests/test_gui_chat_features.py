"""Chat power features on real widgets against a loopback OpenAI-style server that streams reasoning,
tool calls and JSON: the reasoning shown folded and stored (not sent back), tool calls and JSON shown
readably, regenerate and edit as branches (‹ 1/2 ›), Continue, sampling parameters, system-prompt presets, the
context meter, export (Markdown, JSON)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("PySide6")

from PySide6.QtCore import QUrl  # noqa: E402

from wslm.gui.chat_panel import ChatPanel  # noqa: E402
from wslm.gui.chat_session import ChatSession  # noqa: E402
from wslm.gui.chat_store import ChatStore  # noqa: E402
from wslm.gui.settings import Settings  # noqa: E402


class Scripted(BaseHTTPRequestHandler):
    """Streams delta.reasoning_content, then content "Answer N" (N counts requests); a prompt with "weather"
    gets a tool call in pieces, one with "json" a JSON object, one with "long" a reply cut at max tokens; a
    continue_final_message request gets the rest. The usage says the prompt was 100 tokens."""

    requests: list[dict] = []

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        last = body["messages"][-1]["content"]
        finish = "stop"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        deltas = [{"reasoning_content": "Let me "}, {"reasoning_content": "think."}]
        if "weather" in last:
            deltas += [{"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                        "function": {"name": "get_weather", "arguments": ""}}]},
                       {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
                       {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}]
        if body.get("continue_final_message"):
            deltas = [{"content": " and the rest."}]
        elif "long" in last:
            deltas += [{"content": "The beginning"}]
            finish = "length"
        elif "json" in last:
            deltas += [{"content": '{"name": "Ada", '}, {"content": '"age": 36}'}]
        else:
            deltas += [{"content": "Answer "}, {"content": str(len(type(self).requests))}]
        for d in deltas:
            chunk = {"model": body["model"], "choices": [{"index": 0, "delta": d, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        end = {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
               "usage": {"prompt_tokens": 100, "completion_tokens": len(deltas)}}
        self.wfile.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())
        self.wfile.flush()


@pytest.fixture
def panel(qtbot, tmp_path):
    Scripted.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    store = ChatStore(tmp_path / "chats.sqlite3")
    session = ChatSession(store, {"system_prompt": ""})
    settings = Settings(chat_use_server=False, chat_base_url=f"http://127.0.0.1:{server.server_address[1]}/v1",
                        chat_model="thinker", system_prompt="")
    p = ChatPanel(session, settings)
    qtbot.addWidget(p)
    p.show()
    yield p
    session.shutdown()
    server.shutdown()
    server.server_close()
    store.close()


def ask(panel, qtbot, text: str) -> None:
    panel.input.setPlainText(text)
    with qtbot.waitSignal(panel.session.reply_finished, timeout=10_000):
        panel.send()


def test_reasoning_tools_and_json_are_shown_readably(panel, qtbot, tmp_path):
    ask(panel, qtbot, "hello")
    reply = panel.session.messages.messages()[-1]
    assert reply.content == "Answer 1" and reply.stats["reasoning"] == "Let me think."
    assert reply.stats["reasoning_s"] >= 0 and reply.stats["model"] == "thinker"
    panel.view.render()
    text = panel.view.toPlainText()
    assert "Thought for" in text and "Let me think." not in text  # folded
    panel.view._on_link(QUrl("think:1"))
    assert "Let me think." in panel.view.toPlainText()  # click to open
    # Stored with the message; never sent back to the model.
    assert panel.session.store.messages(reply.conversation_id)[-1].stats["reasoning"] == "Let me think."
    ask(panel, qtbot, "what is the weather")
    assert all("think" not in m["content"] for m in Scripted.requests[-1]["messages"])
    call = panel.session.messages.messages()[-1].stats["tool_calls"][0]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
    panel.view.render()
    assert '🔧 get_weather({"city": "Paris"})' in panel.view.toPlainText()
    ask(panel, qtbot, "give json")
    panel.view.render()
    assert '"name": "Ada",\n' in panel.view.toPlainText()  # pretty-printed

    # Export: Markdown with the reasoning folded in <details>, JSON with OpenAI-style messages.
    conv_id = panel.session.messages.conversation_id
    panel.export_chat(conv_id, str(tmp_path / "chat.md"))
    panel.export_chat(conv_id, str(tmp_path / "chat.json"))
    md = (tmp_path / "chat.md").read_text(encoding="utf-8")
    assert "# hello" in md and "<summary>Thought for" in md and "Answer 1" in md and "get_weather" in md
    data = json.loads((tmp_path / "chat.json").read_text(encoding="utf-8"))
    roles = [m["role"] for m in data["messages"]]
    assert roles == ["user", "assistant"] * 3 and data["messages"][1]["reasoning_content"] == "Let me think."
    assert data["messages"][3]["tool_calls"][0]["function"]["name"] == "get_weather"


def view_text(panel) -> str:
    panel.view.render()
    return panel.view.toPlainText()


def shown(session) -> list[str]:
    return [m.content for m in session.messages.messages()]


def test_regenerate_and_edit_make_branches(panel, qtbot, tmp_path):
    session = panel.session
    ask(panel, qtbot, "hello")
    ask(panel, qtbot, "more")
    assert shown(session) == ["hello", "Answer 1", "more", "Answer 2"]
    with qtbot.waitSignal(session.reply_finished, timeout=10_000):
        panel._regenerate(1)
    # A new branch at the reply: what followed the old one is kept there, not shown.
    assert shown(session) == ["hello", "Answer 3"] and "2/2" in view_text(panel)
    assert Scripted.requests[-1]["messages"] == [{"role": "user", "content": "hello"}]
    assert reply_stats_clean(session)
    panel.view._on_link(QUrl("ver:1:0"))  # ‹
    assert shown(session) == ["hello", "Answer 1", "more", "Answer 2"] and "1/2" in view_text(panel)
    ask(panel, qtbot, "and then")  # the shown branch goes on
    assert [m["content"] for m in Scripted.requests[-1]["messages"]] == ["hello", "Answer 1", "more", "Answer 2",
                                                                       "and then"]
    conv_id = session.messages.conversation_id
    assert [m.content for m in session.store.messages(conv_id)] == shown(session)  # the store's active path

    panel.view._on_link(QUrl("edit:0"))
    assert panel.input.toPlainText() == "hello" and panel.editing_row == 0
    panel.input.setPlainText("hello, edited")
    with qtbot.waitSignal(session.reply_finished, timeout=10_000):
        panel.send()
    assert shown(session) == ["hello, edited", "Answer 5"] and "2/2" in view_text(panel)
    assert panel.editing_row == -1 and panel.input.toPlainText() == ""
    panel.view._on_link(QUrl("ver:0:0"))  # back to the original question, with the branches chosen in it
    assert shown(session) == ["hello", "Answer 1", "more", "Answer 2", "and then", "Answer 4"]
    panel.view._on_link(QUrl("ver:1:1"))
    assert shown(session) == ["hello", "Answer 3"]
    assert len(session.store.all_messages(conv_id)) == 9  # nothing was dropped

    # Export and a reopened store follow the shown path.
    panel.export_chat(conv_id, str(tmp_path / "chat.json"))
    data = json.loads((tmp_path / "chat.json").read_text(encoding="utf-8"))
    assert [m["content"] for m in data["messages"]] == ["hello", "Answer 3"]
    again = ChatStore(session.store.path)
    assert [m.content for m in again.messages(conv_id)] == ["hello", "Answer 3"]
    again.close()

    # Deleting a branch's reply shows the other branch there.
    panel.delete_message(1)
    assert shown(session) == ["hello", "Answer 1", "more", "Answer 2", "and then", "Answer 4"]
    assert "2/2" not in view_text(panel)


def reply_stats_clean(session) -> bool:
    """Regenerating no longer keeps versions inside a reply's stats (branches are messages)."""
    return all("versions" not in m.stats for m in session.store.all_messages(session.messages.conversation_id))


def test_continue_a_cut_reply(panel, qtbot):
    session = panel.session
    ask(panel, qtbot, "tell a long story")
    reply = session.messages.messages()[-1]
    assert reply.content == "The beginning" and reply.stats["finish_reason"] == "length"
    assert "hit max tokens" in view_text(panel) and "Continue" in view_text(panel)
    assert "continue:1" in panel.view.toHtml()
    with qtbot.waitSignal(session.reply_finished, timeout=10_000):
        panel.view._on_link(QUrl("continue:1"))
    body = Scripted.requests[-1]
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["messages"][-1] == {"role": "assistant", "content": "The beginning"}
    reply = session.messages.messages()[-1]
    assert reply.content == "The beginning and the rest." and len(session.messages.messages()) == 2
    assert reply.stats["finish_reason"] == "stop" and reply.stats["tokens"] == 4  # 3 before, 1 now
    assert reply.stats["reasoning"] == "Let me think."  # the first part's thinking stays
    saved = session.store.messages(session.messages.conversation_id)[-1]
    assert saved.content == "The beginning and the rest." and "streaming" not in saved.stats
    assert "Continue" not in view_text(panel)
    # A finished reply, or one that is not the last, cannot be continued.
    assert session.continue_reply(1) and not session.busy
    assert Scripted.requests[0].get("continue_final_message") is None  # a normal send does not ask it


def test_sampling_parameters_are_sent_only_when_set(panel, qtbot):
    session = panel.session
    ask(panel, qtbot, "hello")
    optional = {"top_k", "min_p", "repetition_penalty", "seed", "stop", "response_format", "chat_template_kwargs"}
    assert not optional & set(Scripted.requests[-1])
    panel.top_k.setValue(40)
    panel.min_p.setValue(0.05)
    panel.repetition_penalty.setValue(1.1)
    panel.seed.setValue(7)
    panel.stop_strings.setText(r"###, \n\n, a\,b")
    panel.json_mode.setChecked(True)
    panel.reasoning.setCurrentIndex(panel.reasoning.findData(False))
    ask(panel, qtbot, "json please")
    body = Scripted.requests[-1]
    assert body["top_k"] == 40 and body["min_p"] == pytest.approx(0.05) and body["seed"] == 7
    assert body["repetition_penalty"] == pytest.approx(1.1)
    assert body["stop"] == ["###", "\n\n", "a,b"]
    assert body["response_format"] == {"type": "json_object"}
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    conv_id = session.messages.conversation_id
    conv = session.store.get_conversation(conv_id)
    assert conv.top_k == 40 and conv.stop == ["###", "\n\n", "a,b"] and conv.json_mode and conv.reasoning is False

    # Per chat: a new chat starts with the last chat's values (issue 34: they no longer reset); changed there,
    # they stay that chat's own; going back shows the first chat's values.
    panel.new_chat()
    assert panel.top_k.value() == 40 and panel.stop_strings.text() == r"###, \n\n, a\,b"
    panel.top_k.setValue(5)
    panel.reasoning.setCurrentIndex(0)
    assert session.current().top_k == 5 and session.current().reasoning is None
    session.open(conv_id)
    assert panel.top_k.value() == 40 and panel.seed.value() == 7 and panel.json_mode.isChecked()
    assert panel.stop_strings.text() == r"###, \n\n, a\,b" and panel.reasoning.currentData() is False
    # Back to "off": not sent again.
    panel.top_k.setValue(0)
    panel.min_p.setValue(0.0)
    panel.repetition_penalty.setValue(1.0)
    panel.seed.setValue(-1)
    panel.stop_strings.clear()
    panel.json_mode.setChecked(False)
    panel.reasoning.setCurrentIndex(0)
    ask(panel, qtbot, "plain")
    assert not optional & set(Scripted.requests[-1])


def test_system_prompt_presets(panel, qtbot):
    session = panel.session
    panel.new_chat()
    panel.system_prompt.setPlainText("Talk like a pirate.")
    panel.save_preset("Pirate")
    assert session.store.presets() == {"Pirate": "Talk like a pirate."}
    assert panel.preset_combo.currentText() == "Pirate" and panel.preset_delete.isEnabled()
    panel.system_prompt.setPlainText("Be terse.")
    assert panel.preset_combo.currentData() == ""  # edited away: a custom prompt
    panel.save_preset("Terse")
    first = session.messages.conversation_id
    ask(panel, qtbot, "hi")
    panel.new_chat()
    panel._preset_chosen(panel.preset_combo.findData("Pirate"))  # pick it for this chat
    assert session.current().system_prompt == "Talk like a pirate." and session.current().id != first
    ask(panel, qtbot, "ahoy")
    assert Scripted.requests[-1]["messages"][0] == {"role": "system", "content": "Talk like a pirate."}
    session.open(first)
    assert panel.preset_combo.currentData() == "Terse"
    panel.params._delete_preset()
    assert session.store.presets() == {"Pirate": "Talk like a pirate."}
    assert session.current().system_prompt == "Be terse."  # the chat keeps its prompt
    assert panel.preset_combo.findData("Terse") < 0 and not panel.preset_delete.isEnabled()


def test_context_meter(panel, qtbot):
    session = panel.session
    panel.new_chat()
    assert panel.context_meter.text() == ""
    ask(panel, qtbot, "hello " * 200)
    # The server counted the prompt (100 tokens): the meter starts from it, plus the reply since.
    used, window = session.context_usage()
    assert used == 100 + 8 + len("Answer 1") * 2 // 7 and window is None
    assert panel.context_meter.text() == f"≈{used} tokens"
    session.context_len = 120  # the served model's context
    panel.update_context_meter()
    assert panel.context_meter.text() == f"≈{used} / 120" and "color" in panel.context_meter.styleSheet()
    session.context_len = 4096
    panel.update_context_meter()
    assert panel.context_meter.text() == f"≈{used} / 4.1k" and panel.context_meter.styleSheet() == ""
    panel.system_prompt.setPlainText("x" * 3500)  # the next request holds the system prompt too
    assert session.context_usage()[0] == used + 1000 + 8


def test_composer_grows_with_its_text_and_shrinks_back(panel, qtbot):
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest
    from PySide6.QtWidgets import QApplication

    panel.resize(1100, 800)
    qtbot.wait(20)
    box = panel.input
    empty = box.height()
    line = box.fontMetrics().lineSpacing()
    assert empty <= 4 * line  # about two lines when empty (was a fixed 76 px)
    box.setFocus()
    QTest.keyClicks(box, "one")
    for word in ("two", "three", "four", "five"):
        QTest.keyClick(box, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)  # a new line, not Send
        QTest.keyClicks(box, word)
    five = box.height()
    assert five >= empty + 2 * line and box.verticalScrollBar().maximum() == 0  # all shown, no scrolling
    box.setPlainText("\n".join(f"line {i}" for i in range(60)))
    capped = box.height()
    assert five < capped <= box.MAX_LINES * line + 4 * line  # stops growing at ~10 lines ...
    assert capped <= box.CAP_SHARE * panel.view.parentWidget().height() + 1
    assert box.verticalScrollBar().maximum() > 0  # ... and scrolls
    assert panel.view.height() > capped  # the transcript keeps most of the column
    box.setPlainText("word " * 150)  # one long line: its wrapped lines count
    assert box.height() > empty
    box.clear()
    assert box.height() == empty
    # Sending empties it: back to its small size.
    box.setPlainText("a\nb\nc\nd")
    assert box.height() > empty
    with qtbot.waitSignal(panel.session.reply_finished, timeout=10_000):
        panel.send()
    assert box.toPlainText() == "" and box.height() == empty
    # Tab still leaves the box (no tab character).
    panel.activateWindow()
    box.setFocus()
    box.setPlainText("draft")
    QTest.keyClick(box, Qt.Key.Key_Tab)
    assert box.toPlainText() == "draft" and QApplication.focusWidget() is not box


def test_jump_to_latest_button(panel, qtbot):
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QAbstractSlider

    panel.resize(1000, 700)
    view = panel.view
    jump = view.jump_button
    bar = view.verticalScrollBar()
    ask(panel, qtbot, "\n".join(f"line {i}" for i in range(150)))  # far taller than the view
    view.render()
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum())
    assert not jump.isVisible()  # at the bottom: nothing to jump to
    bar.triggerAction(QAbstractSlider.SliderAction.SliderToMinimum)  # the user scrolls up (as a wheel or drag)
    qtbot.waitUntil(jump.isVisible)
    assert bar.value() < bar.maximum() - 40
    assert view.rect().contains(jump.geometry()) and jump.geometry().bottom() > view.height() // 2  # floats low
    view.render()  # new text while scrolled up: the view stays put, the button stays
    assert jump.isVisible() and bar.value() < bar.maximum() - 40
    qtbot.mouseClick(jump, Qt.MouseButton.LeftButton)
    assert bar.value() == bar.maximum() and not jump.isVisible()
    ask(panel, qtbot, "more")  # following again: the new reply is shown at the end
    view.render()
    qtbot.waitUntil(lambda: bar.value() == bar.maximum())
    assert not jump.isVisible()


def test_blockquote_has_a_left_bar(panel, qtbot):
    from PySide6.QtGui import QColor, QTextDocument

    from wslm.gui import markdown

    html = markdown.render_markdown("Before\n\n> quoted words here\n> and a second line\n\nAfter")
    assert "<blockquote" not in html and f"background-color:{markdown.QUOTE_BAR}" in html
    panel.resize(1000, 700)
    panel.session.new_conversation()
    panel.session.messages.append("user", "quote please")
    panel.session.messages.append("assistant", "Before\n\n> quoted words here\n> and a second line\n\nAfter")
    view = panel.view
    view.render()
    qtbot.wait(20)
    image = view.viewport().grab().toImage()
    bar = QColor(markdown.QUOTE_BAR)

    def bar_left_of(text: str) -> tuple[list[int], int]:
        """The x of the bar-coloured pixels left of `text` on its middle row, and where the text starts."""
        cursor = view.document().find(text, 0, QTextDocument.FindFlag.FindCaseSensitively)
        assert not cursor.isNull()
        cursor.setPosition(cursor.selectionStart())
        rect = view.cursorRect(cursor)
        return [x for x in range(rect.left()) if image.pixelColor(x, rect.center().y()) == bar], rect.left()

    for text in ("quoted words", "and a second"):
        xs, text_x = bar_left_of(text)
        assert xs and len(xs) <= 6 and xs[-1] - xs[0] == len(xs) - 1  # a thin solid bar ...
        assert text_x - xs[-1] >= 6  # ... with a gap before the text
    assert not bar_left_of("Before")[0] and not bar_left_of("After")[0]  # only beside the quote
