"""Windows' own LAN addresses and network profiles (PowerShell Get-NetIPAddress /
Get-NetConnectionProfile), for LAN URLs and the "your network is Public" warning."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import asdict, dataclass

from wslm.wsl_bridge import winexec

_SCRIPT = (
    "$ErrorActionPreference='Stop'; "
    "$a = @(Get-NetIPAddress -AddressFamily IPv4 | ForEach-Object { [pscustomobject]@{ "
    "InterfaceAlias = [string]$_.InterfaceAlias; IPAddress = [string]$_.IPAddress; "
    "AddressState = [string]$_.AddressState } }); "
    "$p = @(Get-NetConnectionProfile | ForEach-Object { [pscustomobject]@{ "
    "InterfaceAlias = [string]$_.InterfaceAlias; NetworkCategory = [string]$_.NetworkCategory } }); "
    "[pscustomobject]@{ addresses = $a; profiles = $p } | ConvertTo-Json -Compress -Depth 4"
)
# Interfaces that are not the LAN: WSL's and Hyper-V's virtual switches, loopback.
_VIRTUAL = ("vethernet", "loopback", "wsl", "hyper-v", "default switch")
_CATEGORIES = {"0": "Public", "1": "Private", "2": "DomainAuthenticated"}


@dataclass
class LanAddress:
    interface: str
    address: str
    category: str  # "Public", "Private", "DomainAuthenticated" or "" when Windows has no profile for it

    def to_dict(self) -> dict:
        return asdict(self)


def query_argv() -> list[str]:
    return [winexec.windows_tool("powershell.exe"), "-NoProfile", "-NonInteractive", "-Command", _SCRIPT]


def _as_list(value: object) -> list:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def parse_network_json(text: str) -> list[LanAddress]:
    """LAN IPv4s (not vEthernet/WSL/loopback/APIPA) with their network category."""
    try:
        data = json.loads(text.strip() or "{}")
    except ValueError:
        return []
    if not isinstance(data, dict):
        return []
    categories = {}
    for p in _as_list(data.get("profiles")):
        if isinstance(p, dict):
            cat = str(p.get("NetworkCategory", ""))
            categories[str(p.get("InterfaceAlias", ""))] = _CATEGORIES.get(cat, cat)
    out = []
    for a in _as_list(data.get("addresses")):
        if not isinstance(a, dict):
            continue
        alias, addr = str(a.get("InterfaceAlias", "")), str(a.get("IPAddress", ""))
        state = str(a.get("AddressState", "Preferred"))
        try:
            ip = ipaddress.IPv4Address(addr)
        except ValueError:
            continue
        if ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast:
            continue
        if any(v in alias.lower() for v in _VIRTUAL) or state not in ("Preferred", "4", ""):
            continue
        out.append(LanAddress(alias, addr, categories.get(alias, "")))
    return out


def lan_addresses() -> list[LanAddress]:
    """Windows' real LAN IPv4 addresses (empty when PowerShell cannot tell)."""
    result = winexec.run(query_argv(), timeout=60)
    return parse_network_json(result.stdout) if result.ok else []


def public_profile_warnings(addresses: list[LanAddress], profile: str = "private") -> list[str]:
    """A warning per LAN interface on a Public network, where a Private-only rule does nothing."""
    if "public" in profile.lower() or profile.lower() == "any":
        return []
    return [f"network '{a.interface}' ({a.address}) is Public: the firewall rule only opens the port on "
            f"Private networks, so other devices cannot connect there. Fix: Settings > Network & internet > "
            f"{a.interface} > Network profile type: Private (only on a network you trust)"
            for a in addresses if a.category == "Public"]
