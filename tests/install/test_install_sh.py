"""installer/wsl/install.sh for real: into a temporary HOME and a fresh venv, from a snapshot of this
checkout, with torch from the local wheel (WSLM_TORCH_SPEC="torch==2.13.0"). Then `wslm serve` on the
demo model answers /v1/models, a second run changes nothing, and --uninstall removes exactly what the
install added. The tests in this file run in order and share one installation."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.install

REPO = Path(__file__).resolve().parents[2]
TAG = "[wslm-install]"


def _snapshot(dest: Path) -> Path:
    """Copy the files a release carries, so edits in the working tree during the run change nothing."""
    archive = dest.with_suffix(".tar")
    with tarfile.open(archive, "w") as tar:
        for name in ("pyproject.toml", "README.md", "wslm", "installer"):
            tar.add(REPO / name, arcname=name, filter=lambda t: None if "__pycache__" in t.name else t)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    return dest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Install:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.src = _snapshot(root / "src")
        self.home = root / "home"
        self.home.mkdir()
        self.prefix = self.home / ".wslm"
        self.venv = self.prefix / "venv"
        self.link = self.home / ".local" / "bin" / "wslm"
        self.system_bin = root / "usr-local-bin"
        self.system_bin.mkdir()
        self.script = self.src / "installer" / "wsl" / "install.sh"
        # pip's cache outside the temporary HOME, so a second CI run does not download again.
        cache = os.environ.get("PIP_CACHE_DIR") or str(Path.home() / ".cache" / "pip")
        path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and not p.startswith(sys.prefix)]
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("WSLM_", "VIRTUAL_ENV", "PYTHON"))}
        self.env.update(HOME=str(self.home), PATH=os.pathsep.join(path), PIP_CACHE_DIR=cache,
                        WSLM_TORCH_SPEC="torch==2.13.0", WSLM_SYSTEM_LINK="1",
                        WSLM_SYSTEM_BIN_DIR=str(self.system_bin), OMP_NUM_THREADS="2")

    def run(self, *args: str, env: dict | None = None, timeout: float = 480) -> subprocess.CompletedProcess:
        proc = subprocess.run(["bash", str(self.script), *args], env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=timeout)
        print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n")
        return proc

    def tree(self) -> dict[str, tuple]:
        """Every path under HOME and the system bin folder with its type, size and mtime."""
        out = {}
        for base in (self.home, self.system_bin):
            for p in sorted(base.rglob("*")):
                if "__pycache__" in p.parts or p.is_relative_to(self.home / ".cache"):
                    continue
                st = p.lstat()
                out[str(p)] = (p.is_symlink(), p.is_dir(), st.st_size, st.st_mtime_ns)
        return out


@pytest.fixture(scope="module")
def inst(tmp_path_factory) -> Install:
    return Install(tmp_path_factory.mktemp("install"))


@pytest.mark.timeout(600)
def test_install_then_serve_answers_models(inst: Install):
    started = time.monotonic()
    proc = inst.run()
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for n in range(1, 8):
        assert f"{TAG} step {n}/7: " in out
    assert f"{TAG} torch from WSLM_TORCH_SPEC: torch==2.13.0" in out  # the override beat the CPU/CUDA choice
    assert inst.link.is_symlink() and os.readlink(inst.link) == str(inst.venv / "bin" / "wslm")
    assert os.readlink(inst.system_bin / "wslm") == str(inst.venv / "bin" / "wslm")
    assert f"{TAG} note: {inst.link.parent} is not on your PATH" in out
    assert "[ ok ] demo_model" in out  # wslm doctor ran, with the demo model installed
    assert f"{TAG} done: wslm is installed" in out
    print(f"first install took {time.monotonic() - started:.0f}s")

    # torch stayed the pinned CPU build; the source was the checkout the script lies in.
    py = inst.venv / "bin" / "python"
    version = subprocess.run([str(py), "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert version.startswith("2.13.0")
    assert f"already installed from {inst.src}" not in out and f"{TAG} step 4/7: wslm with the backend" in out

    # The launcher on PATH serves the demo model.
    port = _free_port()
    env = {**inst.env, "PATH": f"{inst.link.parent}{os.pathsep}{inst.env['PATH']}"}
    server = subprocess.Popen(["wslm", "serve", "--host", "127.0.0.1", "--port", str(port),
                               "--max-model-len", "512"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        ready = None
        deadline = time.monotonic() + 240
        lines = []
        while time.monotonic() < deadline:
            line = server.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("{") and json.loads(line).get("event") in ("ready", "error"):
                ready = json.loads(line)
                break
        assert ready and ready["event"] == "ready", "".join(lines[-30:])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as resp:
            models = json.load(resp)
        assert models["object"] == "list" and models["data"], models
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.mark.timeout(300)
def test_second_run_changes_nothing(inst: Install):
    before = inst.tree()
    proc = inst.run()
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"{TAG} done: nothing to change" in out
    assert out.count("already") >= 5
    assert "Successfully installed" not in out and "Collecting" not in out
    assert inst.tree() == before


@pytest.mark.timeout(300)
def test_first_run_dialog_runs_install_sh_in_the_distro(inst: Install, qtbot, tmp_path, monkeypatch):
    """The GUI's offer, through the fake wsl.exe (it runs `bash -c` here like the real one in a distro):
    wslm is missing from the distro's PATH, the button streams install.sh into the distro and runs it,
    and the re-check then finds wslm through the system link install.sh made."""
    pytest.importorskip("PySide6")
    from fake_windows import use

    from wslm.gui.first_run import FirstRunDialog
    from wslm.wsl_bridge.launcher import Target

    fw = use(monkeypatch, tmp_path)
    for key, value in inst.env.items():
        monkeypatch.setenv(key, value)
    # What wsl.exe's non-login shell sees: /usr/local/bin (here inst.system_bin), not ~/.local/bin.
    monkeypatch.setenv("PATH", f"{inst.system_bin}{os.pathsep}{inst.env['PATH']}")
    monkeypatch.setenv("WSLM_INSTALL_SH", str(inst.script))
    (inst.system_bin / "wslm").unlink()

    dialog = FirstRunDialog(Target.wsl("Ubuntu"))
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: dialog.target() == Target.wsl("Ubuntu") and "Fix:" in dialog.result.text(),
                    timeout=60_000)
    assert dialog.install_button.isVisibleTo(dialog)
    dialog.install_button.click()
    qtbot.waitUntil(lambda: dialog.installed, timeout=240_000)
    log = dialog.install_log.toPlainText()
    assert "[wslm-install] step 7/7: wslm doctor" in log and "[wslm-install] done: wslm is installed" in log
    assert "already installed from" in log  # the same checkout: only the missing link was made
    assert os.readlink(inst.system_bin / "wslm") == str(inst.venv / "bin" / "wslm")
    assert (inst.prefix / "install.sh").read_bytes() == inst.script.read_bytes()
    runs = [c for c in fw.calls if c[0] == "wsl.exe" and "sh" in c and "-c" in c]
    assert runs and runs[0][1:5] == ["-d", "Ubuntu", "--", "sh"], runs
    assert "is installed" in dialog.result.text()


@pytest.mark.timeout(120)
def test_system_link_step_alone(inst: Install):
    (inst.system_bin / "wslm").unlink()
    proc = inst.run("--system-link")
    assert proc.returncode == 0, proc.stderr
    assert os.readlink(inst.system_bin / "wslm") == str(inst.venv / "bin" / "wslm")
    # Not writable (a user without root): a clear error, and the line the Windows side runs as root.
    (inst.system_bin / "wslm").unlink()
    inst.system_bin.chmod(0o555)
    try:
        if os.access(inst.system_bin, os.W_OK):  # root writes anyway
            return
        proc = inst.run("--system-link", env={"PATH": "/usr/bin:/bin"})
        assert proc.returncode == 1
        assert f"{TAG} error: cannot create" in proc.stderr and f"{TAG} fix: " in proc.stderr
    finally:
        inst.system_bin.chmod(0o755)
        inst.run("--system-link")


@pytest.mark.timeout(120)
def test_uninstall_removes_what_it_installed(inst: Install):
    models = inst.prefix / "models"
    models.mkdir(exist_ok=True)
    (models / "keep.gguf").write_bytes(b"GGUF")
    foreign = inst.home / ".local" / "bin" / "other-tool"
    foreign.write_text("#!/bin/sh\n")
    proc = inst.run("--uninstall")
    assert proc.returncode == 0, proc.stderr
    assert not inst.venv.exists() and not inst.link.is_symlink() and not (inst.system_bin / "wslm").is_symlink()
    assert not (inst.prefix / "install-state").exists()
    assert (models / "keep.gguf").read_bytes() == b"GGUF" and foreign.exists()
    assert f"{TAG} uninstalled" in proc.stdout
    again = inst.run("--uninstall")
    assert again.returncode == 0 and "nothing to uninstall" in again.stdout


def test_uninstall_leaves_a_foreign_venv_alone(tmp_path):
    home = tmp_path / "home"
    venv = home / ".wslm" / "venv"
    venv.mkdir(parents=True)
    (venv / "mine").write_text("x")
    proc = subprocess.run(["bash", str(REPO / "installer" / "wsl" / "install.sh"), "--uninstall"],
                          env={"HOME": str(home), "PATH": os.environ["PATH"]}, capture_output=True, text=True)
    assert proc.returncode == 1 and (venv / "mine").exists()
    assert f"{TAG} error: {venv} was not made by this installer" in proc.stderr


def test_old_python_gets_the_apt_command(tmp_path):
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    for name in ("python3", "python3.13", "python3.12", "python3.11", "python3.10"):
        (fake_bin / name).write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 'Python 3.8.10'\nexit 1\n")
        (fake_bin / name).chmod(0o755)
    proc = subprocess.run(["bash", str(REPO / "installer" / "wsl" / "install.sh")], capture_output=True, text=True,
                          env={"HOME": str(tmp_path), "PATH": f"{fake_bin}:/usr/bin:/bin"})
    assert proc.returncode == 1
    assert f"{TAG} step 1/7: checking Python" in proc.stdout
    assert "needs Python 3.10 or newer (Python 3.8.10 found)" in proc.stderr
    assert "sudo apt install -y python3 python3-venv" in proc.stderr
    assert not (tmp_path / ".wslm" / "venv").exists()


def test_unknown_option_says_what_to_do(tmp_path):
    script = str(REPO / "installer" / "wsl" / "install.sh")
    env = {"HOME": str(tmp_path), "PATH": os.environ["PATH"]}
    bad = subprocess.run(["bash", script, "--frobnicate"], env=env, capture_output=True, text=True)
    assert bad.returncode == 1 and "unknown option: --frobnicate" in bad.stderr and "--help" in bad.stderr
    help_text = subprocess.run(["bash", script, "--help"], env=env, capture_output=True, text=True)
    assert help_text.returncode == 0 and "--uninstall" in help_text.stdout and "--gui" in help_text.stdout


@pytest.mark.skipif(not shutil.which("shellcheck"), reason="shellcheck is not installed (apt install shellcheck)")
def test_shellcheck_clean():
    # SC2015 (A && B || C): used on purpose where C is the fallback for both A and B failing.
    proc = subprocess.run(["shellcheck", "-e", "SC2015", str(REPO / "installer" / "wsl" / "install.sh"),
                           str(REPO / "installer" / "pyinstaller" / "build.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.timeout(180)
def test_gpu_picks_the_cuda_build_and_a_failed_step_says_what_to_run(tmp_path):
    """A visible NVIDIA GPU (a fake nvidia-smi) selects the CUDA wheel from the PyTorch index; when pip
    cannot get it (here: no index at all) the step, the cause and the fix are named, and a re-run is safe."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA GeForce RTX 4090 (UUID: GPU-1)'\n")
    (fake_bin / "nvidia-smi").chmod(0o755)
    path = [p for p in os.environ["PATH"].split(os.pathsep) if not p.startswith(sys.prefix)]
    env = {"HOME": str(tmp_path), "PATH": os.pathsep.join([str(fake_bin), *path]),
           "WSLM_PIP_ARGS": f"--no-index --find-links {tmp_path / 'no-wheels'} -q"}
    proc = subprocess.run(["bash", str(REPO / "installer" / "wsl" / "install.sh")], env=env,
                          capture_output=True, text=True, timeout=170)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (f"{TAG} NVIDIA GPU found: CUDA build (torch==2.13.0 --index-url "
            "https://download.pytorch.org/whl/cu128)") in proc.stdout
    assert f"{TAG} error: installing torch failed" in proc.stderr and f"{TAG} fix: " in proc.stderr
    assert (tmp_path / ".wslm" / "venv" / "bin" / "python").exists()
    assert "torch=" not in (tmp_path / ".wslm" / "install-state").read_text()  # not recorded: a re-run retries


def _path_without_compilers(folder: Path) -> str:
    """A PATH folder of links to everything on PATH but the C/C++ compilers (a fresh WSL Ubuntu's)."""
    import re

    folder.mkdir()
    compiler = re.compile(r"^(cc|gcc|g\+\+|c\+\+|clang|clang\+\+)(-[\d.]+)?$")
    for d in os.environ["PATH"].split(os.pathsep):
        if not d or d.startswith(sys.prefix) or not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            exe = os.path.join(d, name)
            if not compiler.match(name) and not (folder / name).exists() and os.access(exe, os.X_OK):
                (folder / name).symlink_to(exe)
    return str(folder)


def _fake(folder: Path, name: str, body: str) -> None:
    (folder / name).unlink(missing_ok=True)
    (folder / name).write_text("#!/bin/sh\n" + body)
    (folder / name).chmod(0o755)


def test_a_missing_compiler_is_installed_with_apt_get_or_named(tmp_path):
    """No cc on PATH: with root (here a sudo that needs no password) step 1 apt-gets build-essential; without
    it, a warning with the command, and the install goes on. (The prefix lies under a file, so step 2 stops
    the run right after.)"""
    path = _path_without_compilers(tmp_path / "bin")
    fake_bin = Path(path)
    log = tmp_path / "apt.log"
    _fake(fake_bin, "apt-get", f'echo "$*" >> {log}\n')
    _fake(fake_bin, "sudo", '[ "$1" = -n ] && shift\nexec "$@"\n')
    (tmp_path / "file").write_text("")
    script = str(REPO / "installer" / "wsl" / "install.sh")
    env = {"HOME": str(tmp_path), "PATH": path}
    run = dict(env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    proc = subprocess.run(["bash", script, "--prefix", str(tmp_path / "file" / "wslm")], **run)
    assert proc.returncode == 1 and f"{TAG} error: cannot create" in proc.stderr  # step 2, as planned
    assert f"{TAG} installing build-essential" in proc.stdout, proc.stdout
    calls = log.read_text().splitlines()
    assert calls[0] == "update -qq" and calls[1].startswith("install -y -qq --no-install-recommends build-essential")

    log.unlink()
    _fake(fake_bin, "id", "echo 1000\n")  # not root, and sudo wants a password nobody can type
    _fake(fake_bin, "sudo", "exit 1\n")
    proc = subprocess.run(["bash", script, "--prefix", str(tmp_path / "file" / "wslm")], **run)
    assert proc.returncode == 1 and not log.exists()
    assert f"{TAG} warning: missing build-essential" in proc.stdout
    assert "sudo apt-get install -y build-essential" in proc.stdout
