"""Before the QApplication exists: can Qt open a window here? Qt's own answer to "no" is an abort (SIGABRT,
exit 134) after "libxcb-cursor0 is needed" or "could not connect to display", which names neither the whole
fix nor, without a display, the cause. This says both, and `wslm gui` exits with 1 instead.

Stdlib only, and nothing from wslm.backend: the Windows bundle leaves the backend out (and Windows needs
no check)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

# Platforms that need no display server (Qt's QT_QPA_PLATFORM names).
_HEADLESS = ("offscreen", "minimal", "minimalegl", "vnc", "linuxfb", "eglfs", "vkkhrdisplay")
_NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found", re.MULTILINE)


def apt_package(soname: str) -> str:
    """Debian's package for a shared library: libxcb-cursor.so.0 -> libxcb-cursor0, and a name ending in a
    digit gets a dash (libxkbcommon-x11.so.0 -> libxkbcommon-x11-0). Matches doctor's QT_XCB_LIBS table."""
    name, _, version = soname.partition(".so")
    version = version.lstrip(".").split(".")[0]
    return f"{name}{'-' if name[-1:].isdigit() and version else ''}{version}"


def _plugin_dir(env: Mapping[str, str]) -> Path | None:
    if env.get("QT_QPA_PLATFORM_PLUGIN_PATH"):
        return Path(env["QT_QPA_PLATFORM_PLUGIN_PATH"])
    try:
        import PySide6
    except ImportError:
        return None
    return Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms"


def missing_libraries(plugin: Path, env: Mapping[str, str]) -> list[str]:
    """The shared libraries `plugin` needs that the loader cannot find (from ldd: it lists them all, where
    loading the plugin would stop at the first). [] when unknown (no ldd, no plugin)."""
    ldd = shutil.which("ldd", path=env.get("PATH"))
    if ldd is None or not plugin.is_file():
        return []
    try:
        out = subprocess.run([ldd, str(plugin)], capture_output=True, text=True, timeout=20,
                             env=dict(env)).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return list(dict.fromkeys(_NOT_FOUND.findall(out)))


def in_wsl(env: Mapping[str, str]) -> bool:
    if env.get("WSL_DISTRO_NAME") or env.get("WSL_INTEROP"):
        return True
    try:
        return "microsoft" in Path("/proc/sys/kernel/osrelease").read_text().lower()
    except OSError:
        return False


def _x_server_listens(display: str) -> bool:
    """A local display (":0", ":0.0") has a socket; other forms (ssh's localhost:10.0) are not checked."""
    m = re.fullmatch(r":(\d+)(\.\d+)?", display.strip())
    if m is None:
        return True
    path = f"/tmp/.X11-unix/X{m.group(1)}"
    for address in (path, "\0" + path):  # the file, or Linux's abstract socket of the same name
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(2)
                s.connect(address)
            return True
        except OSError:
            continue
    return False


def no_display_message(env: Mapping[str, str], why: str = "") -> str:
    """`why`: what is missing, in place of "DISPLAY and WAYLAND_DISPLAY are not set"."""
    why = why or "DISPLAY and WAYLAND_DISPLAY are not set"
    if in_wsl(env):
        return (f"wslm gui cannot open a window: this WSL has no display ({why}). WSLg shows Linux windows on the "
                "Windows desktop: update WSL to get it (in PowerShell: wsl --update, then wsl --shutdown, and open "
                "the distro again). Or run an X server on Windows (VcXsrv, X410) and set DISPLAY. Without a window, "
                "`wslm serve` still runs the server.")
    return (f"wslm gui cannot open a window: there is no display ({why}, as in a text console or an SSH session "
            "without -X). Run it from a desktop session, or connect with ssh -X. Without a window, `wslm serve` "
            "still runs the server.")


def _wayland_socket(env: Mapping[str, str]) -> Path | None:
    name = env.get("WAYLAND_DISPLAY", "").strip() or ("wayland-0" if env.get("QT_QPA_PLATFORM") else "")
    if not name:
        return None
    return Path(name) if name.startswith("/") else Path(env.get("XDG_RUNTIME_DIR", "/nonexistent")) / name


def _wayland_listens(env: Mapping[str, str]) -> bool:
    """A compositor accepts connections on WAYLAND_DISPLAY's socket (a file left by one that ended does not:
    Qt's Wayland plugin aborts on it as on none)."""
    path = _wayland_socket(env)
    if path is None or not path.exists():
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(str(path))
        return True
    except OSError:
        return False


def _no_compositor(env: Mapping[str, str]) -> str:
    path = _wayland_socket(env)
    where = f"WAYLAND_DISPLAY={env.get('WAYLAND_DISPLAY', '').strip() or '(unset: wayland-0)'}"
    return f"no Wayland compositor answers at {where} ({path})" if path else f"no Wayland compositor ({where})"


def wayland_fallback(env: Mapping[str, str] | None = None, platform: str | None = None) -> tuple[str, str] | None:
    """QT_QPA_PLATFORM asks for Wayland alone and no compositor answers: Qt's Wayland plugin would abort
    (SIGABRT). (platform to use instead, the message saying so) when an X11 display is there to fall back on;
    None otherwise (display_problem() then says what to do)."""
    env = os.environ if env is None else env
    platform = sys.platform if platform is None else platform
    if not platform.startswith("linux"):
        return None
    platforms = qt_platforms(env)
    if not platforms[0].startswith("wayland") or _wayland_listens(env):
        return None
    if any(p == "xcb" for p in platforms):
        return None  # Qt goes on to xcb by itself
    display = env.get("DISPLAY", "").strip()
    if not display or not _x_server_listens(display):
        return None
    return ("xcb", f"wslm gui: QT_QPA_PLATFORM={env.get('QT_QPA_PLATFORM')} asks for Wayland, but "
                   f"{_no_compositor(env)}. Using X11 (xcb) on DISPLAY={display} instead; unset QT_QPA_PLATFORM "
                   "to make this the default.")


def qt_platforms(env: Mapping[str, str]) -> list[str]:
    """The platform plugins Qt will try, in order: QT_QPA_PLATFORM's list ("wayland;xcb"), else xcb, with
    Wayland first in a session that says it is one (XDG_SESSION_TYPE), as Qt 6 does."""
    chosen = [p.split(":", 1)[0].strip() for p in env.get("QT_QPA_PLATFORM", "").split(";") if p.strip()]
    if chosen:
        return chosen
    return ["wayland", "xcb"] if env.get("XDG_SESSION_TYPE") == "wayland" else ["xcb"]


def display_problem(env: Mapping[str, str] | None = None, platform: str | None = None) -> str | None:
    """Why Qt could not open a window here, with the fix; None when it can (or there is no telling)."""
    env = os.environ if env is None else env
    platform = sys.platform if platform is None else platform
    if not platform.startswith("linux"):
        return None
    platforms = qt_platforms(env)
    if platforms[0] in _HEADLESS:
        return None
    display = env.get("DISPLAY", "").strip()
    if not display and not env.get("WAYLAND_DISPLAY", "").strip():
        return no_display_message(env)
    if any(p.startswith("wayland") for p in platforms) and _wayland_listens(env):
        return None  # Qt tries Wayland (first, or after X11) and a compositor is there
    if "xcb" not in platforms:
        if all(p.startswith("wayland") for p in platforms):
            # Qt's Wayland plugin aborts without a compositor; with an X display wayland_fallback() uses it.
            return (f"wslm gui cannot open a window: QT_QPA_PLATFORM={env.get('QT_QPA_PLATFORM')} asks for "
                    f"Wayland, but {_no_compositor(env)}, and there is no X11 display to use instead"
                    f"{'' if not display else f' (DISPLAY={display} does not answer)'}. Run it from a desktop "
                    "session, or unset QT_QPA_PLATFORM and set DISPLAY to a running X server."
                    + (" In WSL, WSLg provides both: update WSL (in PowerShell: wsl --update, then wsl "
                       "--shutdown)." if in_wsl(env) else ""))
        return None  # a platform we know nothing about: let Qt say
    if not display:
        if _wayland_listens(env):
            return ("wslm gui cannot open a window: Qt uses X11 here, and DISPLAY is not set (this session has "
                    "Wayland only). Run it as: QT_QPA_PLATFORM=wayland wslm gui")
        return no_display_message(env, f"DISPLAY is not set, and {_no_compositor(env)}: a stale WAYLAND_DISPLAY")
    plugins = _plugin_dir(env)
    missing = missing_libraries(plugins / "libqxcb.so", env) if plugins else []
    if missing:
        packages = list(dict.fromkeys(apt_package(lib) for lib in missing))
        return (f"wslm gui cannot open a window: Qt's X11 (xcb) platform plugin needs libraries that are not "
                f"installed ({', '.join(missing)}). Install them with:\n"
                f"    sudo apt-get install -y {' '.join(packages)}\n"
                "then run wslm gui again. (`wslm doctor` checks this too.)")
    if not _x_server_listens(display):
        extra = (" In WSL, WSLg provides it: update WSL (in PowerShell: wsl --update, then wsl --shutdown)."
                 if in_wsl(env) else "")
        return (f"wslm gui cannot open a window: no X server answers on DISPLAY={display}. Start one, or unset "
                f"DISPLAY if it is stale.{extra}")
    return None
