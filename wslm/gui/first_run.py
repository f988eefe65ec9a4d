"""First run (and "Change target"): pick where the backend runs and check that wslm is installed there."""

from __future__ import annotations

import html
import shlex
import sys
from pathlib import Path

from PySide6.QtCore import QObject, QProcess, Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
)

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm import envs
from wslm.gui import theme
from wslm.gui.background import BackgroundCall
from wslm.gui.cli_process import JsonProcess
from wslm.wsl_bridge.launcher import Target

INSTALL_FIX = ("Install wslm inside the distro: open it (wsl -d {distro}) and run the installer, "
               "installer/wsl/install.sh from the wslm release (bash install.sh), or click the button below.")


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
        self.setMinimumSize(620, 480)
        self.chosen: Target | None = None
        self.installed = False
        self.checks: list[dict] = []
        self._installed_text = ""
        self._check: JsonProcess | None = None
        self._doctor: JsonProcess | None = None
        title = QLabel("Where should models run?", objectName="Title")
        intro = QLabel("wslm runs its engine on Linux: inside a WSL distro on Windows, or on this machine "
                       "when it is Linux. You can change this later in the Server panel.", objectName="Muted")
        intro.setWordWrap(True)
        self.combo = QComboBox()
        self.combo.addItem("This machine", Target.local())
        self.combo.currentIndexChanged.connect(self.check)
        self.result = QLabel("Checking…")
        self.result.setWordWrap(True)
        self.result.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.result.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(self.result)
        self.install_button = QPushButton("Run the installer in the distro")
        self.install_button.clicked.connect(lambda: self.install_requested.emit(self.target()))
        self.install_button.hide()
        self.install_requested.connect(self._run_installer)
        self._installer: InstallerRun | None = None
        self.install_log = QPlainTextEdit(readOnly=True)
        self.install_log.setMaximumBlockCount(2000)
        self.install_log.setMinimumHeight(180)
        self.install_log.hide()
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
        lay.addWidget(scroll, 1)
        lay.addWidget(self.install_log)
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
            self._installed_text = (f"<span style='color:{theme.OK};'>✔</span> {html.escape(text)} is installed on "
                                    f"{html.escape(target.describe())}.")
            self.result.setText(self._installed_text + "<br><span style='color:#8d96a8;'>Running wslm doctor…</span>")
            self._run_doctor(target)
            return
        fix = INSTALL_FIX.format(distro=target.distro or "<distro>") if target.via_wsl else (
            "Install it here: pip install wslm[backend] (or run ./setup.sh in a checkout).")
        self.result.setText(f"<span style='color:{theme.ERROR};'>✘</span> wslm is not installed on "
                            f"{html.escape(target.describe())} (exit {code}: {html.escape(text[-200:]) or 'no output'})."
                            f"<br><br><b>Fix:</b> {html.escape(fix)}")
        self.install_button.setVisible(target.via_wsl and not (self._installer and self._installer.running))

    def _run_doctor(self, target: Target) -> None:
        """`wslm doctor --json` on the target: what works there (GPU, disk, demo model) and how to fix the rest."""
        proc = JsonProcess(self)
        found: list[dict] = []
        proc.event.connect(found.append)
        proc.finished.connect(lambda _code, _tail, t=target: self._doctored(t, found))
        self._doctor = proc
        proc.start(target.wslm_argv(["doctor", "--json"]))

    def _doctored(self, target: Target, events: list[dict]) -> None:
        if target != self.target():
            return
        report = next((e for e in events if isinstance(e.get("checks"), list)), None)
        self.checks = report["checks"] if report else []
        if not report:
            self.result.setText(self._installed_text)
            return
        marks = {"ok": ("✔", theme.OK), "warn": ("⚠", theme.WARN), "error": ("✘", theme.ERROR),
                 "fail": ("✘", theme.ERROR)}
        rows = []
        for c in self.checks:
            mark, color = marks.get(str(c.get("status")), ("•", theme.MUTED))
            fix = f"<br>&nbsp;&nbsp;&nbsp;&nbsp;<b>Fix:</b> {html.escape(str(c['fix']))}" if c.get("fix") else ""
            rows.append(f"<span style='color:{color};'>{mark}</span> <b>{html.escape(str(c.get('name', '')))}</b>: "
                        f"<span style='color:#aab1bf;'>{html.escape(str(c.get('detail', '')))}</span>{fix}")
        self.result.setText(self._installed_text + "<br><br>" + "<br>".join(rows))

    def _accept(self) -> None:
        self.chosen = self.target()
        self.accept()

    # --- "Run the installer in the distro" (installer issue) ----------------------------------------
    def _run_installer(self, target: Target) -> None:
        script = find_install_script()
        if script is None:
            self.result.setText("The installer (install.sh) is not part of this wslm. <b>Fix:</b> "
                                + html.escape(INSTALL_FIX.format(distro=target.distro or "<distro>")))
            return
        self.install_button.hide()
        self.install_log.clear()
        self.install_log.show()
        run = InstallerRun(target, script, self)
        run.line.connect(self._on_install_line)
        run.finished.connect(lambda code, t=target: self._on_installed(t, code))
        self._installer = run
        self.result.setText(f"Installing wslm in {html.escape(target.describe())}… (this takes a few minutes)")
        run.start()

    def _on_install_line(self, text: str) -> None:
        self.install_log.appendPlainText(text)
        if text.startswith("[wslm-install] step "):
            self.result.setText(html.escape(text.removeprefix("[wslm-install] ")))

    def _on_installed(self, target: Target, code: int) -> None:
        if code == 0:
            self.check()
            return
        errors = [x for x in self._installer.lines if x.startswith(("[wslm-install] error:", "[wslm-install] fix:"))]
        detail = "<br>".join(html.escape(x.removeprefix("[wslm-install] ")) for x in errors[-4:])
        self.result.setText(f"<span style='color:{theme.ERROR};'>✘</span> The installer failed in "
                            f"{html.escape(target.describe())} (exit {code}). {detail or 'See the log below.'}")
        self.install_button.setVisible(target.via_wsl)


def find_install_script() -> Path | None:
    """install.sh: WSLM_INSTALL_SH, the packaged app's copy, the checkout's, or the one install.ps1 put
    into the GUI's venv (share/wslm/install.sh)."""
    candidates = [str(envs.WSLM_INSTALL_SH or "")]
    bundle = getattr(sys, "_MEIPASS", None)
    if bundle:
        candidates.append(str(Path(bundle) / "share" / "wslm" / "install.sh"))
    candidates += [str(Path(__file__).resolve().parents[2] / "installer" / "wsl" / "install.sh"),
                   str(Path(sys.prefix) / "share" / "wslm" / "install.sh")]
    for c in candidates:
        if c and Path(c).is_file():
            return Path(c)
    return None


def _linux_path(path: Path) -> str:
    """A Windows path as WSL's automount sees it (C:\\x -> /mnt/c/x); POSIX paths unchanged."""
    text = str(path)
    if len(text) > 2 and text[1] == ":" and text[0].isalpha():
        return "/mnt/" + text[0].lower() + text[2:].replace("\\", "/")
    return text


def installer_source(script: Path) -> str:
    """What install.sh installs: the checkout the script lies in, else this GUI's version from PyPI."""
    from wslm import __version__

    root = script.resolve().parents[2] if len(script.resolve().parents) > 2 else None
    if root and (root / "pyproject.toml").is_file() and (root / "wslm").is_dir():
        return _linux_path(root)
    return f"wslm=={__version__}"


# Copies install.sh (our stdin) to ~/.wslm/install.sh in the distro, then runs it with stdin closed, so
# nothing depends on how the distro mounts Windows drives.
_COPY_AND_RUN = ('mkdir -p "$HOME/.wslm" && cat > "$HOME/.wslm/install.sh" && '
                 'exec bash "$HOME/.wslm/install.sh" "$@" < /dev/null')


class InstallerRun(QObject):
    """install.sh inside a WSL distro through wsl.exe (QProcess: never blocks), line by line; then, if
    install.sh asks for it, its --system-link step as root (wsl.exe -u root) so that
    `wsl.exe -d DISTRO -- wslm` finds wslm on the non-login PATH."""

    line = Signal(str)
    finished = Signal(int)  # install.sh's exit code (-1: wsl.exe did not start)

    def __init__(self, target: Target, script: Path, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.target, self.script = target, script
        self.lines: list[str] = []
        self._proc: QProcess | None = None
        self._buf = b""
        self._phase = "install"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.state() != QProcess.ProcessState.NotRunning

    def install_argv(self) -> list[str]:
        args = ["--source", installer_source(self.script)]
        return self.target.program_argv("sh", ["-c", _COPY_AND_RUN, "sh", *args])

    def system_link_argv(self, command: list[str]) -> list[str]:
        argv = self.target.program_argv(command[0], command[1:])
        cut = argv.index("--")
        return [*argv[:cut], "-u", "root", *argv[cut:]]

    def start(self) -> None:
        data = self.script.read_bytes().replace(b"\r\n", b"\n")  # a CRLF checkout must still run in bash
        self._start(self.install_argv(), data)

    def _start(self, argv: list[str], stdin: bytes | None) -> None:
        proc = QProcess(self)
        proc.setProcessChannelMode(QProcess.ProcessChannelMode.MergedChannels)
        proc.readyReadStandardOutput.connect(self._read)
        proc.finished.connect(self._on_finished)
        proc.errorOccurred.connect(self._on_error)
        self._proc, self._buf = proc, b""
        self._emit(f"$ {' '.join(argv)}")
        proc.start(argv[0], argv[1:])
        if stdin is not None:
            proc.write(stdin)
        proc.closeWriteChannel()

    def _emit(self, text: str) -> None:
        self.lines.append(text)
        self.line.emit(text)

    def _read(self) -> None:
        self._buf += bytes(self._proc.readAllStandardOutput().data())
        *done, self._buf = self._buf.split(b"\n")
        for raw in done:
            # pip redraws progress bars with \r: keep what the line finally showed.
            self._emit(raw.decode("utf-8", "replace").rstrip("\r").rsplit("\r", 1)[-1])

    def _on_finished(self, code: int, _status: QProcess.ExitStatus) -> None:
        self._read()
        if self._buf:
            self._emit(self._buf.decode("utf-8", "replace"))
            self._buf = b""
        if self._phase == "install" and code == 0:
            asks = [x for x in self.lines if x.startswith("[wslm-install] needs-system-link: ")]
            if asks and self.target.via_wsl:
                self._phase = "link"
                command = shlex.split(asks[-1].split(": ", 1)[1])
                self._start(self.system_link_argv(command), None)
                return
        self.finished.emit(int(code) if self._phase == "install" else 0)

    def _on_error(self, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart:
            self._emit(f"Could not start {self._proc.program()}: {self._proc.errorString()}")
            self.finished.emit(-1)
