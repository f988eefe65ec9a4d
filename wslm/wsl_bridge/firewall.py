"""Windows Defender Firewall rules (`netsh advfirewall firewall`) and Hyper-V firewall rules
(PowerShell `*-NetFirewallHyperVRule`, mirrored networking) that wslm owns: every name starts with
"wslm", so wslm never touches a rule it did not create.

Default inbound rule: dir=in action=allow protocol=TCP localport=P profile=private remoteip=localsubnet."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from wslm.wsl_bridge import winexec
from wslm.wsl_bridge.validate import validate_port, validate_rule_name

WSL_VM_CREATOR_ID = "{40E0AC32-46A5-438A-A0B2-2B479E8F2E90}"  # the Hyper-V firewall's id for WSL
NO_MATCH_TEXT = "No rules match the specified criteria."


def rule_name(port: int) -> str:
    return f"wslm-share-{validate_port(port)}"


@dataclass(frozen=True)
class FirewallRule:
    name: str
    port: int
    profile: str = "private"  # netsh profile= value
    remoteip: str = "localsubnet"
    enabled: bool = True
    direction: str = "in"
    action: str = "allow"
    protocol: str = "TCP"

    def to_dict(self) -> dict:
        return asdict(self)

    def matches(self, other: FirewallRule) -> bool:
        """Same effect (case-insensitive, profile lists compared as sets)."""
        def norm(r: FirewallRule) -> tuple:
            profiles = frozenset(p.strip().lower() for p in r.profile.split(","))
            return (r.port, profiles, r.remoteip.lower(), r.enabled, r.direction.lower(), r.action.lower(),
                    r.protocol.lower())
        return norm(self) == norm(other)


def parse_show_rule(text: str) -> list[FirewallRule]:
    """Rules from `netsh advfirewall firewall show rule name=...` output (English labels)."""
    rules: list[FirewallRule] = []
    block: dict[str, str] = {}

    def flush() -> None:
        if "rule name" in block:
            port_text = block.get("localport", "").split(",")[0].strip()
            rules.append(FirewallRule(
                name=block["rule name"], port=int(port_text) if port_text.isdigit() else 0,
                profile=block.get("profiles", "").replace(" ", "").lower(),
                remoteip=block.get("remoteip", "").lower(),
                enabled=block.get("enabled", "").lower() == "yes",
                direction=block.get("direction", "").lower(), action=block.get("action", "").lower(),
                protocol=block.get("protocol", "").upper()))
        block.clear()

    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep or line.startswith("-"):
            continue
        key = key.strip().lower()
        if key == "rule name":
            flush()
        block[key] = value.strip()
    flush()
    return rules


def _netsh() -> str:
    return winexec.windows_tool("netsh.exe")


def show_argv(name: str) -> list[str]:
    return [_netsh(), "advfirewall", "firewall", "show", "rule", f"name={validate_rule_name(name)}"]


def show_all_argv() -> list[str]:
    return [_netsh(), "advfirewall", "firewall", "show", "rule", "name=all", "dir=in"]


def get_rule(name: str) -> FirewallRule | None:
    """The named rule, or None ("No rules match the specified criteria.", exit 1)."""
    result = winexec.run(show_argv(name), timeout=30)
    if not result.ok:
        return None
    found = [r for r in parse_show_rule(result.stdout) if r.name.lower() == name.lower()]
    # On a non-English Windows the labels differ: the rule exists, its properties are unknown.
    return found[0] if found else FirewallRule(name=name, port=0, profile="?", remoteip="?")


def wslm_rules() -> list[FirewallRule]:
    """Every inbound rule whose name starts with "wslm" (found by listing all inbound rules)."""
    result = winexec.run(show_all_argv(), timeout=120)
    if not result.ok:
        return []
    return [r for r in parse_show_rule(result.stdout) if r.name.lower().startswith("wslm")]


def add_argv(rule: FirewallRule) -> list[str]:
    return [_netsh(), "advfirewall", "firewall", "add", "rule", f"name={validate_rule_name(rule.name)}",
            f"dir={_word(rule.direction)}", f"action={_word(rule.action)}", f"protocol={_word(rule.protocol)}",
            f"localport={validate_port(rule.port)}", f"profile={_word(rule.profile)}",
            f"remoteip={_word(rule.remoteip)}", f"enable={'yes' if rule.enabled else 'no'}"]


def delete_argv(name: str) -> list[str]:
    return [_netsh(), "advfirewall", "firewall", "delete", "rule", f"name={validate_rule_name(name)}"]


def _word(value: str) -> str:
    import re

    from wslm.wsl_bridge.errors import ValidationError

    if not re.fullmatch(r"[A-Za-z0-9.,/_-]+", value):
        raise ValidationError(f"invalid firewall rule value {value!r}", "use netsh keywords like private, localsubnet")
    return value


# --- Hyper-V firewall (mirrored networking) -------------------------------------------------------

def _ps(script: str) -> list[str]:
    return [winexec.windows_tool("powershell.exe"), "-NoProfile", "-NonInteractive", "-Command",
            "$ErrorActionPreference='Stop'; " + script]


def hyperv_add_argv(name: str, port: int) -> list[str]:
    name, port = validate_rule_name(name), validate_port(port)
    return _ps(f"New-NetFirewallHyperVRule -Name '{name}' -DisplayName '{name}' -Direction Inbound "
               f"-VMCreatorId '{WSL_VM_CREATOR_ID}' -Protocol TCP -LocalPorts {port} -Action Allow | Out-Null")


def hyperv_delete_argv(name: str) -> list[str]:
    return _ps(f"Remove-NetFirewallHyperVRule -Name '{validate_rule_name(name)}'")


def hyperv_list_argv() -> list[str]:
    return _ps("Get-NetFirewallHyperVRule -ErrorAction SilentlyContinue | Where-Object { $_.Name -like 'wslm*' } "
               "| ForEach-Object { [pscustomobject]@{ Name = $_.Name; LocalPorts = [string]($_.LocalPorts -join ',');"
               " Direction = [string]$_.Direction; Action = [string]$_.Action } } | ConvertTo-Json -Compress")


@dataclass(frozen=True)
class HyperVRule:
    name: str
    port: int

    def to_dict(self) -> dict:
        return asdict(self)


def parse_hyperv_list(text: str) -> list[HyperVRule]:
    """HyperVRules from hyperv_list_argv's JSON (one object, a list, or nothing)."""
    text = text.strip()
    if not text:
        return []
    try:
        data = json.loads(text)
    except ValueError:
        return []
    items = data if isinstance(data, list) else [data]
    out = []
    for item in items:
        if isinstance(item, dict) and str(item.get("Name", "")).startswith("wslm"):
            first = str(item.get("LocalPorts", "")).split(",")[0].strip()
            out.append(HyperVRule(str(item["Name"]), int(first) if first.isdigit() else 0))
    return out


def hyperv_rules() -> list[HyperVRule]:
    """wslm's Hyper-V firewall rules (empty on Windows builds without the Hyper-V firewall)."""
    result = winexec.run(hyperv_list_argv(), timeout=60)
    return parse_hyperv_list(result.stdout) if result.ok else []
