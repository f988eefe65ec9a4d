"""Finding and running the Windows programs the bridge uses (wsl.exe, netsh.exe, powershell.exe).

Commands always run from an argv list (never a shell); on Windows the programs are taken by absolute
path from System32 so that a same-named program earlier on PATH cannot be picked up.

Testability contract:
- ``WSLM_WINDOWS_BIN=DIR``: take the three programs from DIR and behave as on Windows on any OS.
- ``WSLM_ASSUME_ADMIN=1``: treat this process as elevated (tests only).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from wslm import envs
from wslm.wsl_bridge.errors import ElevationRequiredError, NotWindowsError, ToolNotFoundError

TOOLS = ("wsl.exe", "netsh.exe", "powershell.exe")
ELEVATION_TEXT = "requires elevation"  # "The requested operation requires elevation (Run as administrator)."


def fake_bin_dir() -> Path | None:
    return envs.WSLM_WINDOWS_BIN


def is_windows() -> bool:
    """True on Windows, or anywhere WSLM_WINDOWS_BIN points at stand-in Windows programs."""
    return os.name == "nt" or fake_bin_dir() is not None


def require_windows(what: str) -> None:
    if not is_windows():
        raise NotWindowsError(
            f"{what} needs Windows (wsl.exe, netsh.exe): this is {os.uname().sysname if hasattr(os, 'uname') else os.name}",
            "run this command from Windows (PowerShell or the wslm app), not inside WSL",
        )


def is_admin() -> bool:
    """Whether this process is elevated (WSLM_ASSUME_ADMIN=1 says yes, for tests)."""
    if envs.WSLM_ASSUME_ADMIN:
        return True
    if os.name == "nt":
        try:
            return bool(ctypes.windll.shell32.IsUserAnAdmin())  # type: ignore[attr-defined]
        except Exception:
            return False
    return False


def windows_tool(name: str) -> str:
    """Absolute path of wsl.exe / netsh.exe / powershell.exe; ToolNotFoundError when missing."""
    if name not in TOOLS:
        raise ValueError(f"not a bridge tool: {name}")
    fake = fake_bin_dir()
    if fake is not None:
        path = fake / name
        if not path.is_file():
            raise ToolNotFoundError(f"{name} not found in WSLM_WINDOWS_BIN={fake}", f"put {name} in {fake}")
        return str(path)
    require_windows(name)
    root = Path(os.environ.get("SystemRoot", r"C:\Windows"))
    sub = Path("WindowsPowerShell", "v1.0", name) if name == "powershell.exe" else Path(name)
    # A 32-bit Python sees SysWOW64 as System32, where wsl.exe does not exist; Sysnative is the real one.
    for folder in ("System32", "Sysnative"):
        path = root / folder / sub
        if path.is_file():
            return str(path)
    if name == "wsl.exe":
        raise ToolNotFoundError("wsl.exe not found: WSL is not installed",
                                "install WSL from an administrator PowerShell: wsl --install")
    raise ToolNotFoundError(f"{name} not found under {root}", "repair Windows or set SystemRoot")


def decode_output(data: bytes) -> str:
    """Text from a Windows program: wsl.exe writes UTF-16LE (UTF-8 with WSL_UTF8=1); netsh the OEM code
    page. Detects UTF-16 by its BOM or NUL bytes, and normalises CR CR LF / CR LF to LF."""
    if not data:
        return ""
    if data.startswith(b"\xff\xfe"):
        text = data[2:].decode("utf-16-le", errors="replace")
    elif data.startswith(b"\xef\xbb\xbf"):
        text = data[3:].decode("utf-8", errors="replace")
    elif b"\x00" in data[:200] and len(data) >= 2:
        text = data[: len(data) - len(data) % 2].decode("utf-16-le", errors="replace")
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = data.decode("cp437", errors="replace")
    text = text.replace("\x00", "")
    while "\r\r\n" in text:
        text = text.replace("\r\r\n", "\r\n")
    return text.replace("\r\n", "\n").replace("\r", "\n")


@dataclass
class Result:
    """The outcome of one command: exit status and decoded, LF-normalised output."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def output(self) -> str:
        return (self.stdout + ("\n" if self.stdout and self.stderr else "") + self.stderr).strip()


def no_window_flags() -> int:
    """creationflags that keep a console window from flashing up when the GUI runs a command."""
    return getattr(subprocess, "CREATE_NO_WINDOW", 0) if os.name == "nt" else 0


def run(argv: list[str], *, timeout: float = 60.0, env: dict[str, str] | None = None,
        input_bytes: bytes | None = None) -> Result:
    """Run argv (no shell), wait, and return a Result; a missing program raises ToolNotFoundError."""
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=timeout, env=env, input=input_bytes,
                              stdin=None if input_bytes is not None else subprocess.DEVNULL,
                              creationflags=no_window_flags())
    except FileNotFoundError as exc:
        raise ToolNotFoundError(f"cannot run {argv[0]}: {exc.strerror}", "check the installation") from None
    except subprocess.TimeoutExpired:
        return Result(argv, 124, "", f"timed out after {timeout:.0f}s")
    # Windows exit codes are unsigned 32-bit; fold 4294967295 back to -1 like the real API reports it.
    rc = proc.returncode - 2**32 if proc.returncode > 2**31 else proc.returncode
    return Result(argv, rc, decode_output(proc.stdout), decode_output(proc.stderr))


def check_elevation(result: Result) -> None:
    """Raise ElevationRequiredError when a command failed only because it needed administrator rights."""
    if not result.ok and ELEVATION_TEXT in result.output.lower():
        raise ElevationRequiredError(
            f"{Path(result.argv[0]).name} needs administrator rights: {result.output}",
            "let wslm ask for permission (UAC) or run from an administrator terminal",
            argv=result.argv, returncode=result.returncode, output=result.output,
        )
