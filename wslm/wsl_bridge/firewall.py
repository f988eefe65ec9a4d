"""Windows Defender Firewall rules and Hyper-V firewall rules (`*-NetFirewallHyperVRule`, mirrored
networking) that wslm owns, through PowerShell's NetSecurity cmdlets: every rule's Name (its
language-independent id) starts with "wslm", so wslm never touches a rule it did not create.

Rules are read as JSON (`Get-NetFirewallRule ... | ConvertTo-Json`), never from netsh's text, whose
labels are translated ("Regelname:", "规则名称:") on a non-English Windows.

Default inbound rule: TCP P, Private profile, remote address LocalSubnet.

Older wslm versions created the rule with `netsh advfirewall firewall add rule name=wslm-share-P`:
such a rule has a GUID for its Name and "wslm-share-P" only as its DisplayName. They are still listed
(`legacy_id` holds the GUID) so that `share off` removes them too."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass

from wslm.wsl_bridge import winexec
from wslm.wsl_bridge.errors import ValidationError
from wslm.wsl_bridge.validate import validate_port, validate_rule_name

WSL_VM_CREATOR_ID = "{40E0AC32-46A5-438A-A0B2-2B479E8F2E90}"  # the Hyper-V firewall's id for WSL
_GUID_RE = re.compile(r"^\{[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}\}$")


def rule_name(port: int) -> str:
    return f"wslm-share-{validate_port(port)}"


@dataclass(frozen=True)
class FirewallRule:
    name: str  # the rule's Name; for a legacy (netsh-made) rule its DisplayName
    port: int  # 0: not a single port (cannot be re-created as it was)
    profile: str = "private"  # lower-case, comma-separated: domain, private, public or any
    remoteip: str = "localsubnet"
    enabled: bool = True
    direction: str = "in"
    action: str = "allow"
    protocol: str = "TCP"
    legacy_id: str = ""  # the GUID Name of a rule an older wslm made with netsh

    def to_dict(self) -> dict:
        return asdict(self)

    def matches(self, other: FirewallRule) -> bool:
        """Same effect (case-insensitive, profile lists compared as sets)."""
        def norm(r: FirewallRule) -> tuple:
            profiles = frozenset(p.strip().lower() for p in r.profile.split(","))
            return (r.port, profiles, r.remoteip.lower(), r.enabled, r.direction.lower(), r.action.lower(),
                    r.protocol.lower())
        return norm(self) == norm(other)


# --- reading: PowerShell JSON -----------------------------------------------------------------------

def _ps(script: str) -> list[str]:
    return [winexec.windows_tool("powershell.exe"), "-NoProfile", "-NonInteractive", "-Command",
            "$ErrorActionPreference='Stop'; " + script]


def list_argv() -> list[str]:
    # By Name (rules wslm creates), plus by DisplayName for the GUID-named rules older wslm made
    # with netsh. Enums are cast to [string]: ConvertTo-Json would write their numbers.
    return _ps("@(Get-NetFirewallRule -Name 'wslm*' -ErrorAction SilentlyContinue) + "
               "@(Get-NetFirewallRule -DisplayName 'wslm*' -ErrorAction SilentlyContinue) "
               "| Sort-Object -Property Name -Unique | ForEach-Object { "
               "$p = $_ | Get-NetFirewallPortFilter; $a = $_ | Get-NetFirewallAddressFilter; "
               "[pscustomobject]@{ Name = $_.Name; DisplayName = $_.DisplayName; Enabled = [string]$_.Enabled; "
               "Direction = [string]$_.Direction; Action = [string]$_.Action; Profile = [string]$_.Profile; "
               "Protocol = [string]$p.Protocol; LocalPort = [string]($p.LocalPort -join ','); "
               "RemoteAddress = [string]($a.RemoteAddress -join ',') } } | ConvertTo-Json -Compress")


def _rule_from_json(item: dict) -> FirewallRule | None:
    name, display = str(item.get("Name") or ""), str(item.get("DisplayName") or "")
    legacy_id = ""
    if not name.lower().startswith("wslm"):
        # Only a netsh-made rule (GUID Name) whose DisplayName is a valid wslm name counts as ours.
        if not (_GUID_RE.fullmatch(name) and re.fullmatch(r"wslm[A-Za-z0-9_.-]{0,60}", display)):
            return None
        name, legacy_id = display, name
    port_text = str(item.get("LocalPort") or "").strip()
    return FirewallRule(
        name=name, port=int(port_text) if port_text.isdigit() else 0,
        profile=str(item.get("Profile") or "").replace(" ", "").lower(),
        remoteip=str(item.get("RemoteAddress") or "").lower(),
        enabled=str(item.get("Enabled") or "").lower() == "true",
        direction={"inbound": "in", "outbound": "out"}.get(str(item.get("Direction") or "").lower(), "?"),
        action=str(item.get("Action") or "").lower(), protocol=str(item.get("Protocol") or "").upper(),
        legacy_id=legacy_id)


def parse_rule_list(text: str) -> list[FirewallRule]:
    """wslm's rules from list_argv's JSON: ConvertTo-Json writes one object bare, several as a
    list, and nothing at all for no rules."""
    text = text.strip()
    if not text:
        return []
    try:
        data = json.loads(text)
    except ValueError:
        return []
    items = data if isinstance(data, list) else [data]
    return [r for r in (_rule_from_json(i) for i in items if isinstance(i, dict)) if r is not None]


def wslm_rules() -> list[FirewallRule]:
    """Every firewall rule wslm made (any direction), new-style first, sorted by name."""
    result = winexec.run(list_argv(), timeout=120)
    if not result.ok:
        return []
    return sorted(parse_rule_list(result.stdout), key=lambda r: (r.name.lower(), bool(r.legacy_id), r.legacy_id))


def get_rules(name: str) -> list[FirewallRule]:
    """The rules called `name`: the one wslm made by Name, and any legacy ones."""
    validate_rule_name(name)
    return [r for r in wslm_rules() if r.name.lower() == name.lower()]


def get_rule(name: str) -> FirewallRule | None:
    found = get_rules(name)
    return found[0] if found else None


# --- changing: New-/Remove-NetFirewallRule ----------------------------------------------------------

_PROFILES = {"domain": "Domain", "private": "Private", "public": "Public", "any": "Any"}
_ADDRESS_RE = re.compile(r"^[0-9A-Fa-f][0-9A-Fa-f.:/-]*$")  # never a leading "-": PowerShell reads a parameter


def _ps_profile(profile: str) -> str:
    parts = [p.strip().lower() for p in profile.split(",")]
    if not parts or any(p not in _PROFILES for p in parts):
        raise ValidationError(f"invalid firewall profile {profile!r}", "use domain, private, public or any")
    return ",".join(_PROFILES[p] for p in parts)


def _ps_remote(remoteip: str) -> str:
    parts = [p.strip() for p in remoteip.split(",")]
    out = []
    for p in parts:
        keyword = {"localsubnet": "LocalSubnet", "any": "Any"}.get(p.lower())
        if keyword is None and not _ADDRESS_RE.fullmatch(p):
            raise ValidationError(f"invalid firewall remote address {remoteip!r}",
                                  "use localsubnet, any, or IP addresses/ranges")
        out.append(keyword or p)
    return ",".join(out)


def _choice(value: str, choices: dict[str, str], what: str) -> str:
    try:
        return choices[value.lower()]
    except KeyError:
        raise ValidationError(f"invalid firewall {what} {value!r}", f"use one of {', '.join(choices)}") from None


def add_argv(rule: FirewallRule) -> list[str]:
    """Create `rule` with Name = DisplayName = rule.name (a fixed shape the elevated helper allows)."""
    name = validate_rule_name(rule.name)
    return _ps(f"New-NetFirewallRule -Name '{name}' -DisplayName '{name}' "
               f"-Direction {_choice(rule.direction, {'in': 'Inbound', 'out': 'Outbound'}, 'direction')} "
               f"-Action {_choice(rule.action, {'allow': 'Allow', 'block': 'Block'}, 'action')} "
               f"-Protocol {_choice(rule.protocol, {'tcp': 'TCP', 'udp': 'UDP'}, 'protocol')} "
               f"-LocalPort {validate_port(rule.port)} -Profile {_ps_profile(rule.profile)} "
               f"-RemoteAddress {_ps_remote(rule.remoteip)} -Enabled {'True' if rule.enabled else 'False'} "
               "| Out-Null")


def delete_argv(name: str) -> list[str]:
    return _ps(f"Remove-NetFirewallRule -Name '{validate_rule_name(name)}'")


def legacy_delete_argv(rule: FirewallRule) -> list[str]:
    """Remove a netsh-made rule by its GUID, and only while its DisplayName is still wslm's."""
    if not _GUID_RE.fullmatch(rule.legacy_id):
        raise ValidationError(f"invalid firewall rule id {rule.legacy_id!r}", "ids are GUIDs in braces")
    return _ps(f"Get-NetFirewallRule -Name '{rule.legacy_id}' | Where-Object {{ $_.DisplayName -eq "
               f"'{validate_rule_name(rule.name)}' }} | Remove-NetFirewallRule")


def legacy_add_argv(rule: FirewallRule) -> list[str]:
    """Re-create a legacy rule as netsh made it (a GUID Name, so no clash with a new-style rule)."""
    return [winexec.windows_tool("netsh.exe"), "advfirewall", "firewall", "add", "rule",
            f"name={validate_rule_name(rule.name)}", f"dir={_word(rule.direction)}", f"action={_word(rule.action)}",
            f"protocol={_word(rule.protocol)}", f"localport={validate_port(rule.port)}",
            f"profile={_word(rule.profile)}", f"remoteip={_word(rule.remoteip)}",
            f"enable={'yes' if rule.enabled else 'no'}"]


def remove_argv(rule: FirewallRule) -> list[str]:
    """The command that removes exactly this rule (by Name, or by GUID for a legacy one)."""
    return legacy_delete_argv(rule) if rule.legacy_id else delete_argv(rule.name)


def restore_argv(rule: FirewallRule) -> list[str] | None:
    """The undo of remove_argv(rule); None when the rule cannot be re-created (no single port)."""
    if not rule.port:
        return None
    try:
        return legacy_add_argv(rule) if rule.legacy_id else add_argv(rule)
    except ValidationError:  # settings wslm never makes: nothing to re-create them from
        return None


def _word(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9.,/_-]+", value):
        raise ValidationError(f"invalid firewall rule value {value!r}", "use netsh keywords like private, localsubnet")
    return value


# --- Hyper-V firewall (mirrored networking) -------------------------------------------------------

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
