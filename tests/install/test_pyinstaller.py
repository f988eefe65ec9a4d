"""The packaged app: installer/pyinstaller/build.sh builds the onedir bundle, which starts and renders
every panel with --screenshot (offscreen Qt), carries install.sh, and leaves torch & co. out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import wslm

pytestmark = pytest.mark.install

REPO = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    pytest.importorskip("PyInstaller", reason="pip install pyinstaller (the dev extra has it)")
    dist = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([str(REPO / "installer" / "pyinstaller" / "build.sh"), str(dist)],
                          env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return dist / "wslm-gui"


@pytest.mark.timeout(660)
def test_bundle_renders_screenshots(bundle: Path, tmp_path):
    exe = bundle / ("wslm-gui.exe" if os.name == "nt" else "wslm-gui")
    assert exe.is_file()
    out = tmp_path / "shots"
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "WSLM_CONFIG_DIR": str(tmp_path / "config")}
    proc = subprocess.run([str(exe), "--screenshot", str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shots = sorted(p.name for p in out.glob("*.png"))
    assert {"chat.png", "models.png", "server.png", "share.png", "logs.png"} <= set(shots), shots
    for name in shots:
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, name


def test_bundle_contents_and_commands(bundle: Path, tmp_path):
    internal = bundle / "_internal"
    names = {p.name.lower() for p in internal.iterdir()}
    for heavy in ("torch", "transformers", "triton", "numpy"):
        assert not any(n == heavy or n.startswith(heavy + "-") or n.startswith(heavy + ".") for n in names), heavy
    assert (internal / "share" / "wslm" / "install.sh").read_bytes() == (REPO / "installer" / "wsl" / "install.sh").read_bytes()
    exe = bundle / "wslm-gui"
    env = {**os.environ, "WSLM_CONFIG_DIR": str(tmp_path / "config")}
    # `wslm ...` commands (install.ps1 -Uninstall runs `wslm-gui.exe share off`), also as `-m wslm`.
    for argv in (["--version"], ["-m", "wslm", "--version"]):
        proc = subprocess.run([str(exe), *argv], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stdout.strip() == f"wslm {wslm.__version__}", proc.stdout + proc.stderr
    proc = subprocess.run([str(exe), "share", "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "{on,off,status,refresh,key}" in proc.stdout
    # LAN sharing's elevated helper is started as `sys.executable -I .../elevated.py ...`.
    helper = internal / "wslm" / "wsl_bridge" / "elevated.py"
    proc = subprocess.run([str(exe), "-I", str(helper), "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "elevated helper" in proc.stdout, proc.stdout + proc.stderr
