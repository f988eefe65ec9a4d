"""Start the desktop app, or render each panel to a PNG (--screenshot) and exit."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QEventLoop
from PySide6.QtWidgets import QApplication

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.display_check import display_problem, wayland_fallback
from wslm.gui.main_window import MainWindow
from wslm.gui.settings import load_settings
from wslm.gui.sidebar import PANELS
from wslm.gui.single_instance import InstanceServer, ask_running_instance
from wslm.gui.theme import apply_theme


def make_app(theme: str = "dark") -> QApplication:
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("wslm")
    app.setOrganizationName("wslm")
    apply_theme(app, theme)
    return app


def _say(text: str) -> None:
    if sys.stderr is not None:  # a windowed (packaged) app has no console
        print(text, file=sys.stderr)


def _raise(windows: list[MainWindow]) -> None:
    _say("wslm gui: another `wslm gui` was started: showing this window instead")
    if windows:
        windows[0].bring_to_front()


def process_events_for(seconds: float, until=None) -> None:
    """Let queued work (subprocess output, layouts) run without blocking the event loop."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        QCoreApplication.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)
        if until is not None and until():
            return
        time.sleep(0.01)


def screenshot(window: MainWindow, out_dir: Path) -> list[Path]:
    """Show each panel and save it as DIR/<panel>.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    window.resize(1280, 800)
    window.show()
    # Wait for `models list` to come back so the models table is not empty.
    process_events_for(20.0, until=lambda: not window.models.loading)
    process_events_for(1.2)  # a few resource samples for the plots
    paths = []
    for key, _icon, _label in PANELS:
        window.sidebar.select(key)
        process_events_for(0.3)
        window.grab()  # offscreen, painting is what lays text out: the first grab settles scroll positions
        process_events_for(0.1)
        path = out_dir / f"{key}.png"
        window.grab().save(str(path))
        paths.append(path)
    return paths


def run(screenshot_dir: str | None = None) -> int:
    if QApplication.instance() is None:
        # QT_QPA_PLATFORM=wayland without a compositor: Qt's Wayland plugin aborts (SIGABRT). Use X11 when
        # there is one, and say so.
        fallback = wayland_fallback()
        if fallback:
            os.environ["QT_QPA_PLATFORM"], message = fallback
            _say(message)
        # Qt aborts (SIGABRT) when it cannot open a window: say why and how to fix it, and exit cleanly.
        problem = display_problem()
        if problem:
            _say(problem)
            return 1
    settings = load_settings()
    app = make_app(settings.theme)
    if screenshot_dir:
        window = MainWindow(settings, watch=True)
        for path in screenshot(window, Path(screenshot_dir)):
            if sys.stdout is not None:  # a windowed (packaged) app has no console
                print(path)
        window.close()
        return 0
    # One app per user and chat store: a second `wslm gui` shows the first one's window and exits. Claimed
    # before the window is built (seconds), so that two started at once do not both open.
    windows: list[MainWindow] = []
    instance = InstanceServer(lambda: _raise(windows))
    pid = ask_running_instance()
    if pid is None and not instance.listen():
        pid = ask_running_instance()
        if pid is None:
            _say(f"wslm gui: could not claim {instance.server.fullServerName() or instance.name} "
                 f"({instance.server.errorString()}); a second wslm gui would open another window")
    if pid is not None:
        _say(f"wslm gui is already running{f' (PID {pid})' if pid else ''}: its window was brought to the front.")
        return 0
    window = MainWindow(settings, watch=True)
    windows.append(window)
    window.show()
    window.maybe_first_run()
    try:
        return app.exec()
    finally:
        instance.close()
