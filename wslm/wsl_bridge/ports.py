"""Port-in-use checks: listening sockets from Linux's /proc/net/tcp{,6}, and Windows' excluded port
ranges (`netsh interface ipv4 show excludedportrange protocol=tcp`), which Hyper-V/WinNAT reserve and
which neither a portproxy rule nor a Windows program can listen on."""

from __future__ import annotations

import ipaddress
import re

from wslm.wsl_bridge import winexec

_TCP_LISTEN = "0A"
_RANGE_RE = re.compile(r"^\s*(\d+)\s+(\d+)(\s+\*)?\s*$")


def _hex_to_ip(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    # IPv6 is four 32-bit words, each in host (little-endian) order.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    addr = ipaddress.IPv6Address(words)
    return str(addr.ipv4_mapped) if addr.ipv4_mapped else str(addr)


def parse_proc_net_tcp(text: str) -> list[tuple[str, int]]:
    """(address, port) of every LISTEN socket in /proc/net/tcp or /proc/net/tcp6 text (both may be
    concatenated)."""
    found = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4 or not parts[0].endswith(":") or parts[3] != _TCP_LISTEN:
            continue
        addr_hex, _, port_hex = parts[1].partition(":")
        try:
            found.append((_hex_to_ip(addr_hex), int(port_hex, 16)))
        except ValueError:
            continue
    return found


def parse_excluded_ranges(text: str) -> list[tuple[int, int]]:
    """(start, end) pairs from `netsh interface ipv4 show excludedportrange protocol=tcp` output."""
    ranges = []
    for line in text.splitlines():
        m = _RANGE_RE.match(line)
        if m:
            ranges.append((int(m.group(1)), int(m.group(2))))
    return ranges


def excluded_port_ranges() -> list[tuple[int, int]]:
    """Windows' excluded TCP port ranges (empty list when netsh cannot tell)."""
    result = winexec.run([winexec.windows_tool("netsh.exe"), "interface", "ipv4", "show", "excludedportrange",
                          "protocol=tcp"], timeout=20)
    return parse_excluded_ranges(result.stdout) if result.ok else []


def excluded_range_for(port: int, ranges: list[tuple[int, int]] | None = None) -> tuple[int, int] | None:
    """The Windows excluded range that contains `port`, or None."""
    for start, end in excluded_port_ranges() if ranges is None else ranges:
        if start <= port <= end:
            return (start, end)
    return None
