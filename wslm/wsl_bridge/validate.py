"""Input checks that run before anything reaches a command line (Windows or Linux)."""

from __future__ import annotations

import ipaddress
import re

from wslm.wsl_bridge.errors import ValidationError

# WSL accepts letters, digits, '.', '_' and '-' in distro names (wsl --import rejects the rest).
_DISTRO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# Names of the firewall rules wslm creates: always the "wslm" prefix, nothing a shell or netsh would split.
_RULE_RE = re.compile(r"^wslm[A-Za-z0-9_.-]{0,60}$")


def validate_port(port: object) -> int:
    """A TCP port 1-65535 as int; raises ValidationError otherwise (bools and floats are rejected)."""
    if isinstance(port, bool):
        raise ValidationError(f"invalid port {port!r}", "use a whole number from 1 to 65535")
    if isinstance(port, str) and port.strip().isdigit():
        port = int(port.strip())
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValidationError(f"invalid port {port!r}: ports are 1-65535", "use a whole number from 1 to 65535")
    return port


def validate_distro(name: object) -> str:
    """A WSL distro name; raises ValidationError for anything with spaces or shell characters."""
    if not isinstance(name, str) or not _DISTRO_RE.fullmatch(name):
        raise ValidationError(
            f"invalid WSL distro name {name!r}",
            "distro names use only letters, digits, '.', '_' and '-' (see `wslm wsl list`)",
        )
    return name


def validate_pid(pid: object) -> int:
    """A Linux PID (> 1: never signal init)."""
    if isinstance(pid, bool) or not isinstance(pid, int) or not 1 < pid < 2**22 + 1:
        raise ValidationError(f"invalid process id {pid!r}", "pass the pid from the backend's ready event")
    return pid


def validate_ipv4(address: object) -> str:
    """A dotted IPv4 address."""
    try:
        return str(ipaddress.IPv4Address(str(address)))
    except ValueError:
        raise ValidationError(f"invalid IPv4 address {address!r}", "use a dotted address like 172.20.1.2") from None


def validate_rule_name(name: object) -> str:
    """A wslm-owned firewall rule name ("wslm" prefix, no spaces or quotes)."""
    if not isinstance(name, str) or not _RULE_RE.fullmatch(name):
        raise ValidationError(f"invalid wslm rule name {name!r}", "rule names start with 'wslm' and use [A-Za-z0-9_.-]")
    return name
