"""Fake wsl.exe: `-l -v`, and `[-d NAME] -- ARGS` run through `bash -c` like the real default shell."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .common import locked_state, record, split_windows_cmdline, state_path

NO_DISTROS = ("Windows Subsystem for Linux has no installed distributions.\r\n"
              "You can resolve this by installing a distribution with the instructions below:\r\n\r\n"
              "Use 'wsl.exe --list --online' to list available distributions\r\n"
              "and 'wsl.exe --install <Distro>' to install.\r\n")
NOT_FOUND = ("There is no distribution with the supplied name.\r\n"
             "Error code: Wsl/Service/WSL_E_DISTRO_NOT_FOUND\r\n")


def _emit(text: str, utf8: bool, line_ending: str = "\r\n", stream=None) -> None:
    text = text.replace("\r\n", "\n").replace("\n", line_ending)
    data = text.encode("utf-8") if utf8 else text.encode("utf-16-le")
    s = stream or sys.stdout
    s.buffer.write(data)
    s.flush()


def _join_like_wsl(args: list[str]) -> str:
    # wsl.exe re-joins its (Windows-parsed) arguments, quoting only those bash would split.
    return " ".join(f'"{a}"' if any(c in a for c in " \t") else a for a in args)


def main() -> int:
    # What CreateProcess would deliver: our argv as a Windows command line, split again by wsl.exe.
    args = split_windows_cmdline(subprocess.list2cmdline(sys.argv[1:]))
    with locked_state() as st:
        record(st, "wsl.exe", list(sys.argv[1:]))
        utf8 = os.environ.get("WSL_UTF8") == "1" and st.get("wsl_utf8_supported", True)
        distros = st["distros"]
        if args[:2] in (["-l", "-v"], ["--list", "--verbose"], ["-l", "--verbose"], ["--list", "-v"]):
            if not distros:
                _emit(NO_DISTROS, utf8)
                return 255  # real: 0xFFFFFFFF
            width = max(len("NAME"), *(len(d["name"]) for d in distros)) + 4
            lines = [f"  {'NAME':<{width}}{'STATE':<16}VERSION"]
            for d in distros:
                lines.append(f"{'*' if d['default'] else ' '} {d['name']:<{width}}{d['state']:<16}{d['version']}")
            _emit("\r\n".join(lines) + "\r\n", utf8, st.get("line_ending", "\r\n"))
            return 0
        name = None
        i = 0
        if args[:1] in (["-d"], ["--distribution"]):
            name, i = args[1], 2
        if args[i : i + 1] != ["--"]:
            _emit("Invalid command line argument: " + " ".join(args[i:]) + "\r\n", utf8)
            return 255
        command = args[i + 1 :]
        if not distros:
            _emit(NO_DISTROS, utf8)
            return 255
        match = [d for d in distros if (name is None and d["default"]) or (name and d["name"].lower() == name.lower())]
        if not match:
            _emit(NOT_FOUND, utf8)
            return 255
        distro = match[0]
        distro["state"] = "Running"  # running a command starts the distro
    env = dict(os.environ, FAKE_WSL_DISTRO=distro["name"], FAKE_WINDOWS_STATE=str(state_path()),
               PATH=str(Path(sys.argv[0]).resolve().parent / "linux_bin") + os.pathsep + os.environ.get("PATH", ""))
    env.pop("FAKE_WIN_ELEVATED", None)
    if os.environ.get("FAKE_WSL_DETACHED"):
        # As the real wsl.exe: the Linux command is not our process, so killing wsl.exe leaves it running.
        return subprocess.Popen(["/bin/bash", "-c", _join_like_wsl(command)], env=env, start_new_session=True).wait()
    os.execve("/bin/bash", ["bash", "-c", _join_like_wsl(command)], env)
    return 1
