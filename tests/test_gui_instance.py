"""Issue 34: one app per user and chat store (bug 12), and QT_QPA_PLATFORM=wayland without a compositor
(bug 13). Real `wslm gui` processes, offscreen (or on an Xvfb when one is installed)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("PySide6")

from wslm.gui.display_check import display_problem  # noqa: E402
from wslm.gui.settings import Settings, save_settings  # noqa: E402
from wslm.gui.single_instance import ask_running_instance, instance_name  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def app_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WSLM_DATA_DIR", "DISPLAY", "WAYLAND_DISPLAY")}
    env.update(WSLM_CONFIG_DIR=str(tmp_path / "config"), QT_QPA_PLATFORM="offscreen",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env.update(extra)
    return env


def start_gui(env: dict[str, str], out: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "wslm", "gui", *args], env=env, cwd=ROOT,
                            stdout=open(out.with_suffix(".out"), "w"), stderr=open(out.with_suffix(".err"), "w"))


def wait_listening(name: str, pid: int, proc: subprocess.Popen, deadline_s: float = 120) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        assert proc.poll() is None, f"the app exited ({proc.returncode})"
        if ask_running_instance(name, ping=True) == pid:
            return
        time.sleep(0.2)
    raise AssertionError("the first app never listened")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.mark.timeout(300)
def test_bug12_a_second_gui_raises_the_first_instead_of_opening(qapp, tmp_path, monkeypatch):
    env = app_env(tmp_path)
    monkeypatch.setenv("WSLM_CONFIG_DIR", env["WSLM_CONFIG_DIR"])
    monkeypatch.delenv("WSLM_DATA_DIR", raising=False)
    save_settings(Settings(first_run_done=True))  # no target dialog
    name = instance_name()  # what the apps compute from the same environment
    first = start_gui(env, tmp_path / "first")
    try:
        wait_listening(name, first.pid, first)
        second = subprocess.run([sys.executable, "-m", "wslm", "gui"], env=env, cwd=ROOT, capture_output=True,
                                text=True, timeout=120)
        assert second.returncode == 0, second.stderr[-2000:]
        assert f"wslm gui is already running (PID {first.pid}): its window was brought to the front." in second.stderr
        assert first.poll() is None  # the first one runs on...
        end = time.monotonic() + 20
        while "showing this window instead" not in (tmp_path / "first.err").read_text() and time.monotonic() < end:
            time.sleep(0.1)
        assert "showing this window instead" in (tmp_path / "first.err").read_text()  # ...and was asked to show
        # A crashed first app leaves its socket behind: the next one starts anyway.
        first.kill()
        first.wait(10)
        third = start_gui(env, tmp_path / "third")
        try:
            wait_listening(name, third.pid, third)
        finally:
            stop(third)
    finally:
        stop(first)


def _xvfb() -> tuple[subprocess.Popen, str] | None:
    if shutil.which("Xvfb") is None:
        return None
    read, write = os.pipe()
    proc = subprocess.Popen(["Xvfb", "-displayfd", str(write), "-nolisten", "tcp", "-screen", "0", "1280x800x24"],
                            pass_fds=(write,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(write)
    with os.fdopen(read) as f:
        number = f.readline().strip()
    if not number:
        proc.kill()
        return None
    return proc, f":{number}"


@pytest.mark.timeout(300)
def test_bug13_wayland_without_a_compositor_does_not_abort(tmp_path):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    (runtime / "wayland-0").touch()  # a socket file left by a compositor that is gone
    env = app_env(tmp_path, QT_QPA_PLATFORM="wayland", WAYLAND_DISPLAY="wayland-0", XDG_RUNTIME_DIR=str(runtime))
    # No X display to fall back on: a clear message and exit status 1, not SIGABRT.
    p = subprocess.run([sys.executable, "-m", "wslm", "gui"], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 1, (p.returncode, p.stderr[-2000:])
    assert "QT_QPA_PLATFORM=wayland asks for Wayland, but no Wayland compositor answers at WAYLAND_DISPLAY=wayland-0" \
        in p.stderr
    assert "qt.qpa" not in p.stderr and "Aborted" not in p.stderr
    # With an X server: it says so and uses X11 (xcb) instead.
    xvfb = _xvfb()
    if xvfb is None:
        pytest.skip("no Xvfb to fall back on")
    server, display = xvfb
    try:
        env["DISPLAY"] = display
        if display_problem(dict(env, QT_QPA_PLATFORM="xcb"), "linux"):
            pytest.skip(f"Qt's xcb plugin cannot run here: {display_problem(dict(env, QT_QPA_PLATFORM='xcb'))}")
        shots = tmp_path / "shots"
        p = subprocess.run([sys.executable, "-m", "wslm", "gui", "--screenshot", str(shots)], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=240)
        assert p.returncode == 0, (p.returncode, p.stderr[-3000:])
        assert f"Using X11 (xcb) on DISPLAY={display} instead" in p.stderr
        assert (shots / "chat.png").is_file()
    finally:
        server.kill()
        server.wait(10)
