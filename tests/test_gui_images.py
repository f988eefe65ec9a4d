"""Images in chat (issue 35): attach (🖼 button, paste, drop) -> thumbnails; the request's image_url content
parts; the chat's SQLite file keeps them (a reopened chat shows and resends them); a server that takes no
images answers 400 and nothing is lost. Real widgets offscreen, a loopback OpenAI-style server."""

from __future__ import annotations

import base64
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("PySide6")

from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl  # noqa: E402
from PySide6.QtGui import (  # noqa: E402
    QColor,
    QDragEnterEvent,
    QDropEvent,
    QGuiApplication,
    QImage,
    QPainter,
    QTextDocument,
)
from PySide6.QtWidgets import QApplication, QDialog, QFileDialog, QLabel  # noqa: E402

from wslm.gui import chat_images  # noqa: E402
from wslm.gui.chat_panel import ChatPanel  # noqa: E402
from wslm.gui.chat_session import ChatSession  # noqa: E402
from wslm.gui.chat_store import ChatStore  # noqa: E402
from wslm.gui.settings import Settings  # noqa: E402

NO_VISION = "text-only"  # the model name our loopback server refuses images for, as a text model's server does


class Server(BaseHTTPRequestHandler):
    bodies: list[dict] = []

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        has_image = any(isinstance(m["content"], list) and any(p["type"] == "image_url" for p in m["content"])
                        for m in body["messages"])
        if body["model"] == NO_VISION and has_image:
            raw = json.dumps({"error": {"message": "The model 'text-only' does not take images (image_url content "
                                                   "parts): serve a vision model.", "code": 400}}).encode()
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for word in ("A red", " square."):
            chunk = {"choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": {"completion_tokens": 3}}
        self.wfile.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Server)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def _picture(w: int = 120, h: int = 80, color: str = "#d83b3b") -> QImage:
    img = QImage(w, h, QImage.Format.Format_RGB32)
    img.fill(QColor("#f4f4f4"))
    p = QPainter(img)
    p.fillRect(w // 6, h // 6, w * 2 // 3, h * 2 // 3, QColor(color))
    p.end()
    return img


def _panel(qtbot, db: Path, url: str, model: str = "llava") -> ChatPanel:
    store = ChatStore(db)
    session = ChatSession(store, {"system_prompt": ""})
    p = ChatPanel(session, Settings(chat_use_server=False, chat_base_url=url, chat_model=model, system_prompt=""))
    qtbot.addWidget(p)
    p.resize(1000, 640)
    p.show()
    qtbot.waitExposed(p)
    return p


def _close(p: ChatPanel) -> None:
    p.session.shutdown()
    p.session.store.close()


def test_attach_paste_drop_give_thumbnails_and_clear_errors(qtbot, tmp_path, server, monkeypatch):
    png = tmp_path / "red.png"
    assert _picture().save(str(png))
    p = _panel(qtbot, tmp_path / "chats.sqlite3", server)
    draft = p.image_draft
    # The 🖼 button's own path: the file dialog (answered here) then reading off the GUI thread.
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *a, **k: ([str(png)], chat_images.IMAGE_FILTER))
    qtbot.mouseClick(p.image_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: draft.rowCount() == 1, timeout=5000)
    assert len(p.composer.image_strip.thumbs) == 1 and p.composer.image_strip.isVisible()
    assert not p.composer.image_strip.thumbs[0].pixmap().isNull()
    # Ctrl+V with a picture on the clipboard.
    QGuiApplication.clipboard().setImage(_picture(60, 60, "#3b6bd8"))
    p.input.setFocus()
    p.input.paste()
    qtbot.waitUntil(lambda: draft.rowCount() == 2, timeout=5000)
    assert draft.images()[1].mime == "image/png" and p.input.toPlainText() == ""
    # Image files dropped on the chat (the panel, and the message box itself).
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(png))])
    for target in (p, p.input.viewport()):
        pos = QPointF(target.width() / 2, target.height() / 2)
        enter = QDragEnterEvent(pos.toPoint(), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                                Qt.KeyboardModifier.NoModifier)
        QApplication.sendEvent(target, enter)
        assert enter.isAccepted()
        drop = QDropEvent(pos, Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
        QApplication.sendEvent(target, drop)
    qtbot.waitUntil(lambda: draft.rowCount() == 4, timeout=5000)
    assert len(p.composer.image_strip.thumbs) == 4 and p.input.toPlainText() == ""  # no path pasted as text
    # ✕ removes one.
    qtbot.mouseClick(p.composer.image_strip.remove_buttons[0], Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: draft.rowCount() == 3, timeout=2000)
    # Not an image, too large: said under the transcript, nothing added.
    fake = tmp_path / "notes.png"
    fake.write_text("not a picture")
    p.add_files([str(fake)])
    qtbot.waitUntil(lambda: "not an image" in p.error_label.text(), timeout=5000)
    monkeypatch.setattr(chat_images, "MAX_FILE_BYTES", 100)
    p.add_files([str(png)])
    qtbot.waitUntil(lambda: "too large" in p.error_label.text(), timeout=5000)
    assert "MB" in p.error_label.text() and draft.rowCount() == 3
    _close(p)


def test_images_go_as_content_parts_are_stored_and_resent(qtbot, tmp_path, server):
    Server.bodies = []
    png = tmp_path / "red.png"
    assert _picture().save(str(png))
    db = tmp_path / "chats.sqlite3"
    p = _panel(qtbot, db, server)
    p.add_files([str(png)])
    qtbot.waitUntil(lambda: p.image_draft.rowCount() == 1, timeout=5000)
    p.input.setPlainText("What is in this picture?")
    with qtbot.waitSignal(p.session.reply_finished, timeout=10000):
        p.send()
    assert p.image_draft.rowCount() == 0 and p.input.toPlainText() == ""  # sent: the composer is empty
    user = Server.bodies[-1]["messages"][-1]
    assert user["role"] == "user" and user["content"][0] == {"type": "text", "text": "What is in this picture?"}
    part = user["content"][1]
    assert part["type"] == "image_url" and part["image_url"]["url"].startswith("data:image/png;base64,")
    assert base64.b64decode(part["image_url"]["url"].split(",", 1)[1]) == png.read_bytes()  # the file as it is
    qtbot.waitUntil(lambda: 'src="chatimg:' in p.view.toHtml(), timeout=3000)
    _close(p)

    # Reopened from the SQLite file: the bubble shows the image, and the next request sends it again.
    p2 = _panel(qtbot, db, server)
    msgs = p2.session.messages.messages()
    assert [m.role for m in msgs] == ["user", "assistant"] and len(msgs[0].images) == 1
    assert msgs[0].images[0].data == png.read_bytes()
    qtbot.waitUntil(lambda: 'src="chatimg:' in p2.view.toHtml(), timeout=3000)
    name = p2.view.toHtml().split('src="', 1)[1].split('"', 1)[0]
    shown = p2.view.document().resource(QTextDocument.ResourceType.ImageResource, QUrl(name))
    assert isinstance(shown, QImage) and not shown.isNull() and shown.width() <= chat_images.THUMB_SIDE
    p2.view.anchorClicked.emit(QUrl("image:0:0"))  # a thumbnail clicked: the full image in a window
    full = next(d for d in p2.findChildren(QDialog) if "red.png" in d.windowTitle())
    assert "120×80" in full.windowTitle() and full.findChild(QLabel).pixmap().width() == 120
    full.close()
    p2.input.setPlainText("And its colour?")
    with qtbot.waitSignal(p2.session.reply_finished, timeout=10000):
        p2.send()
    history = Server.bodies[-1]["messages"]
    assert history[0]["content"][1]["image_url"]["url"] == part["image_url"]["url"]
    assert history[-1] == {"role": "user", "content": "And its colour?"}
    # Exports keep the image (JSON as content parts, Markdown inline).
    conv_id = p2.session.messages.conversation_id
    p2.export_chat(conv_id, str(tmp_path / "chat.json"))
    exported = json.loads((tmp_path / "chat.json").read_text())["messages"][0]["content"]
    assert exported[1]["image_url"]["url"] == part["image_url"]["url"]
    p2.export_chat(conv_id, str(tmp_path / "chat.md"))
    assert "](data:image/png;base64," in (tmp_path / "chat.md").read_text()
    # Edit puts the message's images back in the composer; the developer view elides the base64.
    p2.edit_message(0)
    assert p2.image_draft.rowCount() == 1
    dialog = p2.dev_view()
    assert "bytes)" in dialog.curl and len(dialog.curl) < 5000
    dialog.close()
    p2.cancel_edit()
    _close(p2)


def test_a_text_model_refusing_images_loses_nothing(qtbot, tmp_path, server):
    png = tmp_path / "red.png"
    assert _picture().save(str(png))
    db = tmp_path / "chats.sqlite3"
    p = _panel(qtbot, db, server, model=NO_VISION)
    p.add_files([str(png)])
    qtbot.waitUntil(lambda: p.image_draft.rowCount() == 1, timeout=5000)
    p.input.setPlainText("Describe it")
    with qtbot.waitSignal(p.session.reply_failed, timeout=10000):
        p.send()
    msgs = p.session.messages.messages()
    assert msgs[0].content == "Describe it" and len(msgs[0].images) == 1  # kept in the transcript
    assert "does not take images" in msgs[1].error
    qtbot.waitUntil(lambda: "does not take images" in p.view.toPlainText(), timeout=3000)
    stored = p.session.store.messages(msgs[0].conversation_id)
    assert stored[0].images[0].data == png.read_bytes()
    if os.environ.get("WSLM_SCREENSHOTS"):  # docs/screenshots/image-chat.png, regenerated on request
        _shot(qtbot, tmp_path, server)
    _close(p)


def themed_shot(widget, name: str, width: int) -> None:
    """docs/screenshots/NAME in the app's own theme (put back afterwards), scaled to `width` (kept small)."""
    from wslm.gui.theme import apply_theme

    app = QApplication.instance()
    saved = (app.style().name(), app.styleSheet(), app.palette(), app.font())
    apply_theme(app)
    try:
        QApplication.processEvents()
        widget.grab().scaledToWidth(width, Qt.TransformationMode.SmoothTransformation).save(
            str(Path(__file__).resolve().parents[1] / "docs" / "screenshots" / name), "PNG")
    finally:
        app.setStyle(saved[0])
        app.setStyleSheet(saved[1])
        app.setPalette(saved[2])
        app.setFont(saved[3])


def _shot(qtbot, tmp_path, server) -> None:
    big = tmp_path / "chart.png"
    assert _picture(480, 320, "#2f81f7").save(str(big))
    p = _panel(qtbot, tmp_path / "shot.sqlite3", server)
    p.add_files([str(big)])
    qtbot.waitUntil(lambda: p.image_draft.rowCount() == 1, timeout=5000)
    p.input.setPlainText("What colour is the square?")
    with qtbot.waitSignal(p.session.reply_finished, timeout=10000):
        p.send()
    QGuiApplication.clipboard().setImage(_picture(60, 60, "#3fb950"))
    p.input.paste()
    qtbot.waitUntil(lambda: p.image_draft.rowCount() == 1, timeout=5000)
    p.input.setPlainText("And this one?")
    qtbot.wait(300)
    themed_shot(p, "image-chat.png", 900)
    _close(p)


def test_the_real_server_with_the_text_only_demo_refuses_and_nothing_is_lost(qtbot, tmp_path):
    """`wslm serve` with the demo model (text only): a 400 the chat shows with what to do; the message and its
    image stay; the developer view reads the real /metrics (no speculative decoding there: "off")."""
    from test_server_helpers import SMALL, ServerProcess

    srv = ServerProcess("demo", "--port", "0", *SMALL)
    try:
        png = tmp_path / "red.png"
        assert _picture().save(str(png))
        p = _panel(qtbot, tmp_path / "chats.sqlite3", srv.base_url, model="demo")
        p.add_files([str(png)])
        qtbot.waitUntil(lambda: p.image_draft.rowCount() == 1, timeout=5000)
        p.input.setPlainText("What is this?")
        with qtbot.waitSignal(p.session.reply_failed, timeout=30000) as failed:
            p.send()
        message = failed.args[1]
        assert "400" in message and "image" in message and "kept" in message
        msgs = p.session.messages.messages()
        assert msgs[0].content == "What is this?" and msgs[0].images[0].data == png.read_bytes()
        qtbot.waitUntil(lambda: p.spec_meter.available is False, timeout=10000)
        dialog = p.dev_view()
        assert "Speculative decoding: off" in dialog.spec_label.text()
        dialog.close()
        _close(p)
    finally:
        srv.stop()


def test_content_parts_through_the_context_fit_and_the_developer_view():
    from wslm.gui.content_parts import (
        IMAGE_TOKEN_ESTIMATE,
        ChatImage,
        content_bytes,
        elide_images,
        explain_refusal,
        message_content,
        text_of,
    )
    from wslm.gui.context_fit import TRUNCATE_MIDDLE, fit_messages

    im = ChatImage("image/png", b"\x89PNG" + b"x" * 3000, "a.png")
    assert message_content("hi", []) == "hi"
    assert message_content("", [im]) == [im.part()]  # no empty text part
    long = message_content("word " * 4000, [im])
    assert text_of(long) == "word " * 4000 and content_bytes(long) == 20000 + IMAGE_TOKEN_ESTIMATE * 4
    # Cut to fit: the text's middle goes, the image stays a content part (never its repr as text).
    fit = fit_messages([{"role": "user", "content": long}], 2048, 256, TRUNCATE_MIDDLE)
    assert fit.messages is not None and "characters cut" in fit.note
    kept = fit.messages[0]["content"]
    assert kept[1] == im.part() and len(text_of(kept)) < 20000 and "left out" in text_of(kept)
    body = elide_images({"messages": [{"role": "user", "content": long}]})
    assert body["messages"][0]["content"][1]["image_url"]["url"] == "data:image/png;base64,…(3,004 bytes)"
    assert explain_refusal("The server answered 400: no", [{"role": "user", "content": long}]).endswith(
        "remove them.")
    assert explain_refusal("The server answered 400: no", [{"role": "user", "content": "x"}]) == \
        "The server answered 400: no"
