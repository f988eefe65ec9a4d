"""The app as a whole: `wslm gui --screenshot`, settings and window geometry restored, first run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("PySide6")

from PySide6.QtGui import QImage  # noqa: E402

from wslm.gui.chat_store import ChatStore  # noqa: E402
from wslm.gui.first_run import FirstRunDialog  # noqa: E402
from wslm.gui.main_window import MainWindow  # noqa: E402
from wslm.gui.settings import Settings, load_settings, save_settings, settings_path  # noqa: E402
from wslm.wsl_bridge.launcher import Target  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PANELS = ["chat", "models", "server", "share", "logs"]


@pytest.mark.timeout(180)
def test_screenshot_writes_each_panel_and_exits(tmp_path):
    env = {**os.environ, "WSLM_CONFIG_DIR": str(tmp_path / "config"), "QT_QPA_PLATFORM": "offscreen"}
    (tmp_path / "config" / "data").mkdir(parents=True)
    store = ChatStore(tmp_path / "config" / "data" / "chats.sqlite3")
    conv = store.create_conversation("Hello")
    store.add_message(conv.id, "user", "Say hi in Chinese")
    store.add_message(conv.id, "assistant", "你好！\n\n```python\nprint('hi')\n```", stats={"tokens_per_s": 42.0})
    store.close()
    out = tmp_path / "shots"
    p = subprocess.run([sys.executable, "-m", "wslm", "gui", "--screenshot", str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=150)
    assert p.returncode == 0, p.stderr[-2000:]
    for name in PANELS:
        img = QImage(str(out / f"{name}.png"))
        assert not img.isNull() and img.width() >= 1000 and img.height() >= 600, name
    assert sorted(x.name for x in out.iterdir()) == sorted(f"{n}.png" for n in PANELS)


# The Windows bundle (installer/pyinstaller) leaves these out: the app must render without them.
BUNDLE_EXCLUDES = ("wslm.backend", "wslm.kernels", "torch", "transformers", "triton", "numpy", "fastapi")

BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + '.') for b in %r):
            raise ModuleNotFoundError('the bundle leaves out ' + name, name=name)
sys.meta_path.insert(0, Block())
sys.argv = ['wslm', 'gui', '--screenshot', sys.argv[1]]
from wslm.cli import main
sys.exit(main())
"""


@pytest.mark.timeout(180)
def test_gui_runs_without_the_backend(tmp_path):
    """What the packaged app can import: a GUI module reaching into wslm.backend breaks the Windows bundle."""
    env = {**os.environ, "WSLM_CONFIG_DIR": str(tmp_path / "config"), "QT_QPA_PLATFORM": "offscreen"}
    out = tmp_path / "shots"
    p = subprocess.run([sys.executable, "-c", BLOCKER % (BUNDLE_EXCLUDES,), str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=150)
    assert p.returncode == 0, p.stderr[-2000:]
    assert sorted(x.name for x in out.iterdir()) == sorted(f"{n}.png" for n in PANELS)


def test_settings_and_geometry_survive_restart(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    store = ChatStore(tmp_path / "c.sqlite3")
    w = MainWindow(Settings(first_run_done=True), store, watch=False)
    qtbot.addWidget(w)
    w.show()
    w.resize(1150, 700)
    w.sidebar.select("server")
    w.server_panel.port.setValue(8123)
    w.server_panel.auto_restart.setChecked(True)
    w.close()
    data = json.loads(settings_path().read_text())
    assert data["port"] == 8123 and data["auto_restart"] is True and data["last_panel"] == "server"
    w2 = MainWindow(load_settings(), store, watch=False)
    qtbot.addWidget(w2)
    w2.show()
    # The offscreen screen is 800x800 and Qt fits restored windows onto the screen, so only the
    # height (which fits) comes back exactly; a few pixels go to the (virtual) window frame.
    assert abs(w2.height() - 700) <= 4 and w2.settings.window_geometry
    page = w2.stack.currentWidget()  # the Server panel, inside its scrolling page
    assert page.widget() is w2.server_panel and w2.server_panel.port.value() == 8123
    assert w2.server.auto_restart is True
    w2.close()
    store.close()


def test_corrupt_settings_are_kept_aside(tmp_path):
    path = tmp_path / "gui.json"
    path.write_text("{not json")
    assert load_settings(path) == Settings()
    assert (tmp_path / "gui.json.bad").read_text() == "{not json"
    save_settings(Settings(port=9000, extra={"future_key": 1}), path)
    again = load_settings(path)
    assert again.port == 9000 and again.extra == {"future_key": 1}


@pytest.mark.timeout(60)
def test_first_run_finds_wslm_on_this_machine(qtbot):
    dialog = FirstRunDialog(Target.local())
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: dialog.installed, timeout=30_000)
    assert "is installed" in dialog.result.text()
    qtbot.waitUntil(lambda: bool(dialog.checks), timeout=30_000)  # wslm doctor ran there
    assert {"python", "gpu"} <= {c["name"] for c in dialog.checks} and "gpu" in dialog.result.text()
    dialog.ok.click()
    assert dialog.chosen == Target.local()


@pytest.mark.timeout(60)
def test_first_run_shows_the_fix_when_wslm_is_missing(qtbot):
    dialog = FirstRunDialog(Target.local())
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: dialog.installed, timeout=30_000)
    dialog.combo.addItem("broken", Target.local(wslm_command=["/nonexistent/wslm"]))
    dialog.combo.setCurrentIndex(dialog.combo.count() - 1)
    qtbot.waitUntil(lambda: "Fix:" in dialog.result.text(), timeout=30_000)
    assert not dialog.installed and "not installed" in dialog.result.text()


def test_chats_survive_an_app_restart(qtbot, tmp_path, monkeypatch):
    """The whole app, twice, on its default SQLite file in the data dir."""
    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    w = MainWindow(Settings(first_run_done=True), watch=False)
    qtbot.addWidget(w)
    conv = w.session.new_conversation()
    w.session.messages.append("user", "Do you remember me? 还记得我吗？")
    w.session.messages.append("assistant", "Yes.")
    w.session.conversations.rename(0, "Memory test")
    w.close()  # closes its own database
    assert (tmp_path / "config" / "data" / "chats.sqlite3").exists()
    w2 = MainWindow(load_settings(), watch=False)
    qtbot.addWidget(w2)
    assert w2.session.messages.conversation_id == conv.id  # the latest chat is open again
    assert [m.content for m in w2.session.messages.messages()] == ["Do you remember me? 还记得我吗？", "Yes."]
    assert w2.chat_panel.title.text() == "Memory test"
    w2.close()
