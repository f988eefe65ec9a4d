"""Start the desktop app, or render each panel to a PNG (--screenshot) and exit."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QEventLoop
from PySide6.QtWidgets import QApplication

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.display_check import display_problem
from wslm.gui.main_window import MainWindow
from wslm.gui.sidebar import PANELS
from wslm.gui.theme import apply_theme


def make_app() -> QApplication:
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("wslm")
    app.setOrganizationName("wslm")
    apply_theme(app)
    return app


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
        # Qt aborts (SIGABRT) when it cannot open a window: say why and how to fix it, and exit cleanly.
        problem = display_problem()
        if problem:
            if sys.stderr is not None:
                print(problem, file=sys.stderr)
            return 1
    app = make_app()
    window = MainWindow(watch=True)
    if screenshot_dir:
        for path in screenshot(window, Path(screenshot_dir)):
            if sys.stdout is not None:  # a windowed (packaged) app has no console
                print(path)
        window.close()
        return 0
    window.show()
    window.maybe_first_run()
    return app.exec()
