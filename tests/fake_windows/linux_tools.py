"""Linux-side tools of the fake distros: `ip -4 -o addr show eth0` and `wslinfo --networking-mode`."""

from __future__ import annotations

import os
import sys

from .common import load_state


def _distro() -> dict:
    name = os.environ.get("FAKE_WSL_DISTRO", "")
    return next(d for d in load_state()["distros"] if d["name"] == name)


def ip_main() -> int:
    d = _distro()
    if sys.argv[1:] != ["-4", "-o", "addr", "show", "eth0"]:
        sys.stderr.write(f"fake ip: unsupported arguments {sys.argv[1:]}\n")
        return 1
    ip = d.get("ip")
    if ip:
        sys.stdout.write(f"2: eth0    inet {ip}/20 brd 172.20.15.255 scope global eth0\\       "
                         "valid_lft forever preferred_lft forever\n")
    return 0


def wslinfo_main() -> int:
    d = _distro()
    if not d.get("has_wslinfo", True):
        sys.stderr.write("bash: line 1: wslinfo: command not found\n")
        return 127
    if sys.argv[1:] == ["--networking-mode"]:
        sys.stdout.write(d.get("mode", "nat") + "\n")
        return 0
    sys.stderr.write("Usage: wslinfo [--networking-mode] ...\n")
    return 1
