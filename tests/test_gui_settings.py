"""Issue 34: the Settings dialog (File → Settings…, Ctrl+,) and the API key a user can see and copy.

Real windows (offscreen), the real settings file under a temporary WSLM_CONFIG_DIR."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("PySide6")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtGui import QGuiApplication  # noqa: E402
from PySide6.QtWidgets import QApplication, QLabel, QLineEdit  # noqa: E402

from wslm.gui.chat_store import ChatStore  # noqa: E402
from wslm.gui.main_window import MainWindow  # noqa: E402
from wslm.gui.models_folder import apply_models_dir  # noqa: E402
from wslm.gui.settings import Settings, load_settings  # noqa: E402
from wslm.gui.settings_dialog import SettingsDialog  # noqa: E402
from wslm.gui.theme import current_theme  # noqa: E402

MODELS = [{"id": "demo", "name": "demo"}, {"id": "tiny-chat", "name": "tiny-chat"}]


@pytest.fixture
def make_window(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delenv("WSLM_MODELS_DIR", raising=False)
    made = []

    def make(settings: Settings | None = None) -> MainWindow:
        window = MainWindow(settings or load_settings(), ChatStore(tmp_path / "chats.sqlite3"), watch=False)
        qtbot.addWidget(window)
        window.show()
        qtbot.waitUntil(lambda: not window.models.loading, timeout=60_000)
        window.models.table.set_models(MODELS)
        window._on_models_listed([m["id"] for m in MODELS])
        made.append(window)
        return window

    yield make
    for window in made:
        window.close()
    apply_models_dir("")  # the process's environment as it was


def test_settings_round_trip_and_the_server_panel_follows(make_window, qtbot, tmp_path):
    window = make_window(Settings(first_run_done=True))
    window.settings_action.trigger()  # File → Settings…
    dialog = window.settings_dialog
    assert isinstance(dialog, SettingsDialog) and dialog.isVisible()
    assert window.settings_action.shortcut().toString() == "Ctrl+,"
    assert [dialog.nav.item(i).text() for i in range(dialog.nav.count())] == ["General", "API key", "Documents", "MCP"]

    dialog.model.setCurrentIndex(dialog.model.findData("tiny-chat"))
    dialog.start_on_launch.setChecked(True)
    models = tmp_path / "my models"
    dialog.models_dir.setText(str(models))
    dialog.theme.setCurrentIndex(dialog.theme.findData("light"))
    dialog.show_page("API key")
    dialog.api_key.generate_button.click()
    key = dialog.api_key.text()
    assert key.startswith("sk-wslm-")
    dialog.show_page("Documents")
    dialog.embed_url.setText("http://127.0.0.1:9/v1")
    dialog.embed_model.setText("all-MiniLM-L6-v2")
    dialog.whole.setValue(5000)
    dialog.top_k.setValue(6)
    dialog.accept()  # OK
    qtbot.waitUntil(lambda: window.settings_dialog is None)

    # The Server panel follows at once: model, start-on-launch, key.
    panel = window.server_panel
    assert panel.model_id() == "tiny-chat" and panel.start_on_launch.isChecked() and panel.api_key.text() == key
    assert panel.config().api_key == key
    assert current_theme() == "light"
    assert os.environ["WSLM_MODELS_DIR"] == str(models) and "WSLM_MODELS_DIR" in os.environ["WSLENV"].split(":")
    # Saved: the file has them, and a reopened dialog shows them.
    saved = load_settings()
    assert (saved.model, saved.start_server_on_launch, saved.models_dir, saved.theme, saved.api_key) == \
        ("tiny-chat", True, str(models), "light", key)
    assert (saved.rag_embed_base_url, saved.rag_embed_model, saved.rag_whole_file_tokens, saved.rag_top_k) == \
        ("http://127.0.0.1:9/v1", "all-MiniLM-L6-v2", 5000, 6)
    again = window.open_settings()
    assert again.values()["model"] == "tiny-chat" and again.values()["api_key"] == key
    assert again.values()["models_dir"] == str(models) and again.values()["theme"] == "light"
    shown = again.values()
    again.reject()
    window.close()

    # A fresh app object reads the same file: same values, and its Server panel shows them.
    fresh = make_window()
    assert fresh.settings.api_key == key and fresh.server_panel.api_key.text() == key
    assert fresh.server_panel.model_id() == "tiny-chat" and fresh.server_panel.start_on_launch.isChecked()
    reopened = fresh.open_settings()
    assert reopened.values() == shown
    # Cancel changes nothing.
    reopened.start_on_launch.setChecked(False)
    reopened.reject()
    assert fresh.settings.start_server_on_launch and load_settings().start_server_on_launch
    fresh.open_settings().theme.setCurrentIndex(0)
    fresh.settings_dialog.accept()
    assert current_theme() == "dark"


def test_ctrl_comma_opens_settings_and_pages_can_be_added(make_window, qtbot):
    window = make_window(Settings(first_run_done=True))
    window.activateWindow()
    qtbot.keyClick(window, Qt.Key.Key_Comma, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: window.settings_dialog is not None and window.settings_dialog.isVisible())
    dialog = window.settings_dialog
    # The MCP page is a slot another part fills: add_page() with its title replaces the placeholder.
    tools = QLabel("my MCP servers")
    dialog.add_page("MCP", tools)
    dialog.show_page("MCP")
    assert dialog.stack.currentWidget() is tools and dialog.nav.count() == 4
    dialog.add_page("Extra", QLabel("x"))
    assert dialog.nav.count() == 5
    # The main window's own list of pages goes into every dialog it opens.
    dialog.reject()
    qtbot.waitUntil(lambda: window.settings_dialog is None)
    window.settings_pages.append(("MCP", lambda: QLabel("from the MCP part")))
    dialog = window.open_settings("MCP")
    assert dialog.stack.currentWidget().text() == "from the MCP part"
    dialog.reject()


def test_bug3_api_key_can_be_shown_and_copied(make_window, qtbot):
    """Bug 3: the generated key was masked, Ctrl+C copied nothing and there was no Show or Copy."""
    window = make_window(Settings(first_run_done=True, api_key="sk-wslm-secret-123"))
    field = window.server_panel.api_key_field
    edit = window.server_panel.api_key
    assert edit.echoMode() == QLineEdit.EchoMode.Password and edit.displayText() != "sk-wslm-secret-123"
    clipboard = QGuiApplication.clipboard()
    clipboard.setText("before")
    # Copy: the key on the clipboard (and a word in the status bar).
    qtbot.mouseClick(field.copy_button, Qt.MouseButton.LeftButton)
    assert clipboard.text() == "sk-wslm-secret-123"
    assert "copied" in window.status.currentMessage()
    # Show: the key in plain text, and Ctrl+C on the selected text copies it too.
    qtbot.mouseClick(field.show_button, Qt.MouseButton.LeftButton)
    assert edit.echoMode() == QLineEdit.EchoMode.Normal and edit.displayText() == "sk-wslm-secret-123"
    assert field.show_button.text() == "Hide"
    clipboard.setText("before")
    edit.setFocus()
    edit.selectAll()
    qtbot.keyClick(edit, Qt.Key.Key_C, Qt.KeyboardModifier.ControlModifier)
    assert clipboard.text() == "sk-wslm-secret-123"
    qtbot.mouseClick(field.show_button, Qt.MouseButton.LeftButton)
    assert edit.echoMode() == QLineEdit.EchoMode.Password
    # Generate: a new key, saved at once, shown in the Settings dialog's own field (show/copy there too).
    qtbot.mouseClick(field.generate_button, Qt.MouseButton.LeftButton)
    new = edit.text()
    assert new.startswith("sk-wslm-") and new != "sk-wslm-secret-123" and load_settings().api_key == new
    dialog = window.open_settings("API key")
    assert dialog.api_key.text() == new
    dialog.api_key.show_button.click()
    assert dialog.api_key.edit.displayText() == new
    dialog.api_key.copy_button.click()
    assert clipboard.text() == new
    # Regenerate there: the Server panel follows on OK.
    dialog.api_key.generate_button.click()
    newer = dialog.api_key.text()
    dialog.accept()
    assert newer != new and edit.text() == newer and window.server_panel.config().api_key == newer


def test_dialog_fits_the_smallest_window_and_tabs_through(make_window, qtbot):
    window = make_window(Settings(first_run_done=True, api_key="sk-wslm-k"))
    window.resize(window.minimumSizeHint())
    dialog = window.open_settings()
    dialog.resize(dialog.minimumSizeHint())
    qtbot.waitExposed(dialog)
    for title in ("General", "API key", "Documents", "MCP"):
        dialog.show_page(title)
        page = dialog.stack.currentWidget()
        assert page.minimumSizeHint().width() <= dialog.stack.width() + 1, title
    # Keyboard: Tab reaches every field of the API key page.
    dialog.show_page("API key")
    dialog.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is dialog)
    dialog.nav.setFocus()
    seen = set()
    for _ in range(12):
        qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Tab)
        seen.add(QApplication.focusWidget())
    f = dialog.api_key
    assert {f.edit, f.show_button, f.copy_button, f.generate_button} <= seen
    dialog.reject()


def test_models_folder_reaches_wsl_through_wslenv():
    own = {"WSLM_MODELS_DIR": "/mine"}  # the app was started with its own folder; the setting is empty
    apply_models_dir("", own)
    assert own == {"WSLM_MODELS_DIR": "/mine"}
    env = {"WSLENV": "FOO/p:WSLM_API_KEY"}
    apply_models_dir("/home/me/models", env)
    assert env["WSLM_MODELS_DIR"] == "/home/me/models" and env["WSLENV"] == "FOO/p:WSLM_API_KEY:WSLM_MODELS_DIR"
    apply_models_dir("/home/me/other", env)
    assert env["WSLENV"].count("WSLM_MODELS_DIR") == 1
    apply_models_dir("", env)  # back to the backend's default
    assert "WSLM_MODELS_DIR" not in env and env["WSLENV"] == "FOO/p:WSLM_API_KEY"
    # The server the app starts gets it (its environment starts from the app's).
    from wslm.gui.server_controller import ServerConfig

    apply_models_dir("/srv/models")
    try:
        for config in (ServerConfig(), ServerConfig(api_key="k")):
            assert config.env()["WSLM_MODELS_DIR"] == "/srv/models"
            assert "WSLM_MODELS_DIR" in config.env()["WSLENV"].split(":")
    finally:
        apply_models_dir("")
