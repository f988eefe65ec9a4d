"""First run (and "Change target"): pick where the backend runs and check that wslm is installed there."""

from __future__ import annotations

import html

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
)

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui import theme
from wslm.gui.background import BackgroundCall
from wslm.gui.cli_process import JsonProcess
from wslm.wsl_bridge.launcher import Target

INSTALL_FIX = ("Install wslm inside the distro: open it (wsl -d {distro}) and run the installer, "
               "installer/install.sh from the wslm release.")


def list_wsl_distros() -> list[dict]:
    """Blocking (runs wsl.exe): call through BackgroundCall."""
    from wslm.wsl_bridge import winexec, wsl

    if not winexec.is_windows():
        return []
    return [d.to_dict() for d in wsl.list_distros()]


class FirstRunDialog(QDialog):
    install_requested = Signal(object)  # Target: the installer issue hooks "run install.sh" here

    def __init__(self, current: Target | None = None, parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Welcome to wslm")
        self.setMinimumWidth(560)
        self.chosen: Target | None = None
        self.installed = False
        self._check: JsonProcess | None = None
        title = QLabel("Where should models run?", objectName="Title")
        intro = QLabel("wslm runs its engine on Linux: inside a WSL distro on Windows, or on this machine "
                       "when it is Linux. You can change this later in the Server panel.", objectName="Muted")
        intro.setWordWrap(True)
        self.combo = QComboBox()
        self.combo.addItem("This machine", Target.local())
        self.combo.currentIndexChanged.connect(self.check)
        self.result = QLabel("Checking…")
        self.result.setWordWrap(True)
        self.install_button = QPushButton("Run the installer in the distro")
        self.install_button.clicked.connect(lambda: self.install_requested.emit(self.target()))
        self.install_button.hide()
        self.recheck = QPushButton("Check again")
        self.recheck.clicked.connect(self.check)
        self.ok = QPushButton("Use this target", objectName="Primary")
        self.ok.clicked.connect(self._accept)
        buttons = QHBoxLayout()
        buttons.addWidget(self.install_button)
        buttons.addStretch(1)
        buttons.addWidget(self.recheck)
        buttons.addWidget(self.ok)
        lay = QVBoxLayout(self)
        lay.addWidget(title)
        lay.addWidget(intro)
        lay.addSpacing(8)
        lay.addWidget(self.combo)
        lay.addWidget(self.result)
        lay.addStretch(1)
        lay.addLayout(buttons)
        self._current = current
        self._load_distros()
        self.check()

    def _load_distros(self) -> None:
        call = BackgroundCall(list_wsl_distros, self)
        call.done.connect(self._on_distros)
        call.failed.connect(lambda err: self.result.setText(f"Could not list WSL distros: {html.escape(err)}"))
        call.start()

    def _on_distros(self, distros: list) -> None:
        for d in distros:
            name = d.get("name", "")
            try:
                target = Target.wsl(name)
            except ValueError:
                continue
            label = f"WSL: {name}" + (" (default)" if d.get("default") else "") + (
                "" if d.get("version", 2) == 2 else " — WSL 1")
            self.combo.addItem(label, target)
            if self._current and self._current.via_wsl and self._current.distro == name:
                self.combo.setCurrentIndex(self.combo.count() - 1)
            elif d.get("default") and not (self._current and not self._current.via_wsl):
                self.combo.setCurrentIndex(self.combo.count() - 1)

    def target(self) -> Target:
        return self.combo.currentData() or Target.local()

    def check(self, *_args) -> None:
        """Run `wslm --version` on the target."""
        target = self.target()
        self.installed = False
        self.result.setText(f"Checking whether wslm is installed on {target.describe()}…")
        self.install_button.hide()
        proc = JsonProcess(self)
        out: list[str] = []
        proc.log_line.connect(out.append)
        proc.finished.connect(lambda code, tail, t=target: self._checked(t, code, out))
        self._check = proc
        proc.start(target.wslm_argv(["--version"]))

    def _checked(self, target: Target, code: int, out: list[str]) -> None:
        if target != self.target():
            return
        text = " ".join(x for x in out if x.strip())
        if code == 0 and "wslm" in text:
            self.installed = True
            self.result.setText(f"<span style='color:{theme.OK};'>✔</span> {html.escape(text)} is installed on "
                                f"{html.escape(target.describe())}.")
            return
        fix = INSTALL_FIX.format(distro=target.distro or "<distro>") if target.via_wsl else (
            "Install it here: pip install wslm[backend] (or run ./setup.sh in a checkout).")
        self.result.setText(f"<span style='color:{theme.ERROR};'>✘</span> wslm is not installed on "
                            f"{html.escape(target.describe())} (exit {code}: {html.escape(text[-200:]) or 'no output'})."
                            f"<br><br><b>Fix:</b> {html.escape(fix)}")
        self.install_button.setVisible(target.via_wsl)

    def _accept(self) -> None:
        self.chosen = self.target()
        self.accept()
