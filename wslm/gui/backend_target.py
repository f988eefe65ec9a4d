"""Where the backend runs, and the argv that runs `wslm ...` there.

Adapter over wslm.wsl_bridge.launcher: the GUI only asks for argv lists and runs them with QProcess."""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """`local` (this Linux machine) or `wsl` (a WSL distro, reached through wsl.exe)."""

    kind: str = "local"
    distro: str = ""

    @property
    def label(self) -> str:
        return "This machine" if self.kind == "local" else f"WSL: {self.distro}"

    def to_dict(self) -> dict:
        return {"kind": self.kind} if self.kind == "local" else {"kind": "wsl", "distro": self.distro}

    @classmethod
    def from_dict(cls, data: dict | None) -> Target:
        data = data or {}
        if data.get("kind") == "wsl" and data.get("distro"):
            return cls("wsl", str(data["distro"]))
        return cls("local")


def local_wslm_argv(args: list[str]) -> list[str]:
    """`wslm ARGS` with this very interpreter, so the GUI and the commands it runs agree on versions."""
    return [sys.executable, "-m", "wslm", *args]


def wslm_argv(target: Target, args: list[str]) -> list[str]:
    """The argv that runs `wslm ARGS` on the target."""
    if target.kind == "local":
        return local_wslm_argv(args)
    return ["wsl.exe", "-d", target.distro, "--", "wslm", *args]


def program_argv(target: Target, argv: list[str]) -> list[str]:
    """The argv that runs any Linux program (nvidia-smi) on the target."""
    if target.kind == "local":
        return list(argv)
    return ["wsl.exe", "-d", target.distro, "--", *argv]


def stop_argv(target: Target, pid: int) -> list[str] | None:
    """How to stop a backend by its Linux PID; None when terminating our own child process suffices."""
    if target.kind == "local":
        return None
    return program_argv(target, ["kill", "-TERM", str(int(pid))])
