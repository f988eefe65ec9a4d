"""WSL distros (`wsl.exe -l -v`), networking mode and the distro's IPv4.

    list_distros() -> list[Distro]       # name, state, version, default
    default_distro() -> Distro
    get_distro(name) -> Distro           # validated, and must be installed
    networking_mode(distro) -> "nat" | "mirrored" | ...   # wslinfo, then .wslconfig
    wsl_ip(distro) -> "172.x.y.z"        # eth0's IPv4 (not `hostname -i`, which can say 127.0.1.1)
"""

from __future__ import annotations

import configparser
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from wslm.wsl_bridge import winexec
from wslm.wsl_bridge.errors import WslError
from wslm.wsl_bridge.launcher import Target
from wslm.wsl_bridge.validate import validate_distro

_LINE_RE = re.compile(r"^\s*(\*)?\s*(\S+)\s+(.+?)\s+(\d+)\s*$")
_INET_RE = re.compile(r"\binet\s+(\d{1,3}(?:\.\d{1,3}){3})/\d+")


@dataclass
class Distro:
    name: str
    state: str  # as wsl.exe says it: "Running", "Stopped", "Installing", ...
    version: int  # 1 or 2
    default: bool

    @property
    def running(self) -> bool:
        return self.state.lower() == "running"

    def to_dict(self) -> dict:
        return {**asdict(self), "running": self.running}


def parse_wsl_list(data: bytes | str) -> list[Distro]:
    """Distros from `wsl.exe -l -v` output: UTF-16LE or UTF-8, CRLF or CR CR LF, `*` marks the default."""
    text = winexec.decode_output(data) if isinstance(data, bytes) else winexec.decode_output(data.encode())
    distros = []
    lines = [ln for ln in text.split("\n") if ln.strip()]
    for line in lines[1:]:  # the first line is the (possibly localised) NAME STATE VERSION header
        m = _LINE_RE.match(line)
        if m:
            distros.append(Distro(name=m.group(2), state=m.group(3).strip(), version=int(m.group(4)),
                                  default=bool(m.group(1))))
    return distros


def list_distros() -> list[Distro]:
    """Installed distros. Raises WslError when WSL has none or wsl.exe fails."""
    env = dict(os.environ, WSL_UTF8="1")  # only in the child; older wsl.exe ignores it (UTF-16 still parsed)
    result = winexec.run([winexec.windows_tool("wsl.exe"), "-l", "-v"], timeout=60, env=env)
    if "has no installed distributions" in result.output:
        raise WslError("WSL has no installed distributions", "install one: wsl --install -d Ubuntu")
    if not result.ok:
        raise WslError(f"wsl.exe -l -v failed (exit {result.returncode}): {result.output}",
                       "check that WSL works: run `wsl --status` in PowerShell")
    distros = parse_wsl_list(result.stdout)
    if not distros:
        raise WslError("WSL has no installed distributions", "install one: wsl --install -d Ubuntu")
    return distros


def default_distro() -> Distro:
    distros = list_distros()
    for d in distros:
        if d.default:
            return d
    return distros[0]


def get_distro(name: str | None) -> Distro:
    """The named distro (validated first), or the default one for None."""
    if name is None:
        return default_distro()
    validate_distro(name)
    for d in list_distros():
        if d.name.lower() == name.lower():
            return d
    raise WslError(f"WSL distro {name!r} is not installed", "see `wslm wsl list` for the installed distros")


def parse_wslconfig_mode(text: str) -> str | None:
    """`networkingMode` from the [wsl2] section of a .wslconfig, lower-cased (None when unset)."""
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error:
        return None
    for section in parser.sections():
        if section.strip().lower() == "wsl2" and parser.has_option(section, "networkingmode"):
            return parser.get(section, "networkingmode").strip().strip("\"'").lower() or None
    return None


def wslconfig_path() -> Path:
    return Path(os.environ.get("USERPROFILE") or Path.home()) / ".wslconfig"


def networking_mode(distro: str | None = None) -> str:
    """WSL's networking mode: `wslinfo --networking-mode` inside the distro (WSL 2.0+), falling back
    to .wslconfig's networkingMode, then "nat" (the default)."""
    if distro is not None:
        validate_distro(distro)
    if winexec.is_windows():
        result = Target.wsl(distro).run("wslinfo", ["--networking-mode"], timeout=60)
        mode = result.stdout.strip().lower()
        if result.ok and re.fullmatch(r"[a-z]+", mode):
            return mode
        try:
            text = wslconfig_path().read_text(encoding="utf-8-sig", errors="replace")
        except OSError:
            text = ""
        return parse_wslconfig_mode(text) or "nat"
    # Inside WSL (or plain Linux) ask wslinfo directly; plain Linux has no WSL networking at all.
    result = Target.local().run("wslinfo", ["--networking-mode"]) if _which("wslinfo") else None
    return result.stdout.strip().lower() if result and result.ok and result.stdout.strip() else "nat"


def _which(name: str) -> bool:
    import shutil

    return shutil.which(name) is not None


def parse_ip_addr(text: str) -> str | None:
    """The first IPv4 in `ip -4 -o addr show eth0` output."""
    m = _INET_RE.search(text)
    return m.group(1) if m else None


def wsl_ip(distro: str | None = None) -> str:
    """The distro's IPv4 on eth0 (the address a NAT portproxy must connect to)."""
    target = Target.wsl(distro) if winexec.is_windows() else Target.local()
    result = target.run("ip", ["-4", "-o", "addr", "show", "eth0"], timeout=60)
    ip = parse_ip_addr(result.stdout) if result.ok else None
    if not ip:
        raise WslError(f"cannot find the IPv4 address of eth0 in {target.describe()}: {result.output or 'no output'}",
                       "start the distro (wsl -d NAME) and check `ip -4 addr show eth0` there; "
                       "install iproute2 if `ip` is missing")
    return ip
