"""Fake powershell.exe for the few scripts the bridge runs: Start-Process -Verb RunAs (UAC),
network addresses/profiles, Get-/New-/Remove-NetFirewallRule and the Hyper-V firewall cmdlets.

Firewall rules come from the same state as netsh's ("firewall"), as on Windows: a rule netsh made has
a GUID Name. ConvertTo-Json -Compress writes one object bare, several as a list, and nothing for none."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys

from .common import elevated, injected_failure, locked_state, record, rule_id, split_windows_cmdline

CANCELLED = ("Start-Process : This command cannot be run due to the error: The operation was canceled by the user.\r\n"
             "At line:1 char:37\r\n"
             "+ CategoryInfo          : InvalidOperation: (:) [Start-Process], InvalidOperationException\r\n"
             "+ FullyQualifiedErrorId : InvalidOperationException,Microsoft.PowerShell.Commands.StartProcessCommand\r\n")


def _err(text: str) -> int:
    sys.stderr.write(text.replace("\n", "\r\n") + "\r\n")
    return 1


def _unquote(s: str) -> str:
    return s.replace("''", "'")


def main() -> int:
    args = sys.argv[1:]
    if args[:3] != ["-NoProfile", "-NonInteractive", "-Command"] or len(args) != 4:
        return _err(f"fake powershell: unexpected arguments {args}")
    script = args[3]
    with locked_state() as st:
        record(st, "powershell.exe", args)
        if injected_failure(st, args):
            return _err("fake failure: The parameter is incorrect.")
        if "Start-Process" in script:
            m = re.search(r"-FilePath '((?:[^']|'')*)' -ArgumentList '((?:[^']|'')*)' -Verb RunAs", script)
            if not m:
                return _err("Start-Process : A parameter cannot be found that matches the given arguments.")
            if st.get("uac") == "cancel":
                sys.stderr.buffer.write(CANCELLED.encode())
                return 1
            argv = [_unquote(m.group(1)), *split_windows_cmdline(_unquote(m.group(2)))]
            run_elevated = True
        else:
            run_elevated = False
            result = _cmdlet(st, script)
    if run_elevated:
        # An elevated process starts with a fresh environment, not the caller's.
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "SYSTEMROOT", "TMP", "TEMP")}
        env["FAKE_WIN_ELEVATED"] = "1"
        return subprocess.run(argv, env=env, stdin=subprocess.DEVNULL).returncode
    return result


def _to_json(items: list[dict]) -> str:
    if not items:
        return ""
    return json.dumps(items[0] if len(items) == 1 else items, separators=(",", ":"), ensure_ascii=False) + "\r\n"


_PROFILE_ORDER = ["domain", "private", "public"]  # the Profile flags' order, as [string] writes them


def _rule_json(r: dict) -> dict:
    profiles = [p for p in _PROFILE_ORDER if p in r["profile"].split(",")]
    return {"Name": rule_id(r), "DisplayName": r["name"], "Enabled": "True" if r.get("enable", "yes") == "yes" else "False",
            "Direction": "Inbound" if r["dir"] == "in" else "Outbound", "Action": r["action"].capitalize(),
            "Profile": ", ".join(p.capitalize() for p in profiles) if profiles else "Any",
            "Protocol": {"tcp": "TCP", "udp": "UDP"}.get(r["protocol"], "Any"),
            "LocalPort": "Any" if r["localport"].lower() == "any" else r["localport"],
            "RemoteAddress": {"localsubnet": "LocalSubnet", "any": "Any"}.get(r["remoteip"].lower(), r["remoteip"])}


def _no_rule(cmdlet: str, name: str) -> int:
    return _err(f"{cmdlet} : No MSFT_NetFirewallRule objects found with property 'Name' equal to '{name}'.  "
                "Verify the value of the property and retry.")


def _firewall_rule_cmdlets(st: dict, script: str) -> int | None:
    """Get-NetFirewallRule (-Name / -DisplayName wildcards, listed as JSON), New-NetFirewallRule,
    Remove-NetFirewallRule -Name, and Get -Name GUID | Where DisplayName -eq | Remove; None: not one."""
    if "Get-NetFirewallRule" in script and "ConvertTo-Json" in script:
        found: dict[str, dict] = {}
        for prop, pattern in re.findall(r"Get-NetFirewallRule -(Name|DisplayName) '([^']*)'", script):
            for r in st["firewall"]:
                value = rule_id(r) if prop == "Name" else r["name"]
                if fnmatch.fnmatchcase(value.lower(), pattern.lower()):
                    found.setdefault(rule_id(r).lower(), r)  # Sort-Object -Unique: case-insensitive
        sys.stdout.write(_to_json([_rule_json(found[k]) for k in sorted(found)]))
        return 0
    m = re.search(r"New-NetFirewallRule -Name '([^']+)' -DisplayName '([^']+)' -Direction (\w+) -Action (\w+) "
                  r"-Protocol (\w+) -LocalPort (\d+) -Profile ([\w,]+) -RemoteAddress (\S+) -Enabled (\w+)", script)
    if m:
        if not elevated(st):
            return _err("New-NetFirewallRule : Access is denied.")
        if any(rule_id(r).lower() == m.group(1).lower() for r in st["firewall"]):
            return _err("New-NetFirewallRule : Cannot create a file when that file already exists.")
        st["firewall"].append({"name": m.group(2), "dir": "in" if m.group(3) == "Inbound" else "out",
                               "action": m.group(4).lower(), "protocol": m.group(5).lower(), "localport": m.group(6),
                               "profile": m.group(7).lower(), "remoteip": m.group(8).lower(),
                               "enable": "yes" if m.group(9) == "True" else "no", "id": m.group(1)})
        return 0
    m = re.search(r"Get-NetFirewallRule -Name '([^']+)' \| Where-Object \{ \$_\.DisplayName -eq '([^']+)' \} "
                  r"\| Remove-NetFirewallRule", script)
    if m:
        match = [r for r in st["firewall"] if rule_id(r).lower() == m.group(1).lower()]
        if not match:
            return _no_rule("Get-NetFirewallRule", m.group(1))
        gone = [r for r in match if r["name"].lower() == m.group(2).lower()]
        if gone and not elevated(st):
            return _err("Remove-NetFirewallRule : Access is denied.")
        st["firewall"] = [r for r in st["firewall"] if r not in gone]
        return 0
    m = re.search(r"Remove-NetFirewallRule -Name '([^']+)'", script)
    if m:
        if not elevated(st):
            return _err("Remove-NetFirewallRule : Access is denied.")
        gone = [r for r in st["firewall"] if rule_id(r).lower() == m.group(1).lower()]
        if not gone:
            return _no_rule("Remove-NetFirewallRule", m.group(1))
        st["firewall"] = [r for r in st["firewall"] if r not in gone]
        return 0
    return None


def _cmdlet(st: dict, script: str) -> int:
    result = _firewall_rule_cmdlets(st, script)
    if result is not None:
        return result
    if "Get-NetIPAddress" in script:
        sys.stdout.write(json.dumps({"addresses": st["addresses"], "profiles": st["profiles"]}) + "\r\n")
        return 0
    if "Get-NetFirewallHyperVRule" in script:
        rules = [{"Name": r["name"], "LocalPorts": str(r["port"]), "Direction": "Inbound", "Action": "Allow"}
                 for r in st["hyperv"] if r["name"].startswith("wslm")]
        if rules:  # ConvertTo-Json: one object is not wrapped in a list; none prints nothing
            sys.stdout.write(json.dumps(rules[0] if len(rules) == 1 else rules) + "\r\n")
        return 0
    m = re.search(r"New-NetFirewallHyperVRule -Name '([^']+)'.*-LocalPorts (\d+)", script)
    if m:
        if not elevated(st):
            return _err("New-NetFirewallHyperVRule : Access is denied.")
        if any(r["name"] == m.group(1) for r in st["hyperv"]):
            return _err("New-NetFirewallHyperVRule : Cannot create a file when that file already exists.")
        st["hyperv"].append({"name": m.group(1), "port": int(m.group(2))})
        return 0
    m = re.search(r"Remove-NetFirewallHyperVRule -Name '([^']+)'", script)
    if m:
        if not elevated(st):
            return _err("Remove-NetFirewallHyperVRule : Access is denied.")
        if not any(r["name"] == m.group(1) for r in st["hyperv"]):
            return _err(f"Remove-NetFirewallHyperVRule : No MSFT_NetFirewallHyperVRule objects found with property "
                        f"'Name' equal to '{m.group(1)}'.")
        st["hyperv"] = [r for r in st["hyperv"] if r["name"] != m.group(1)]
        return 0
    return _err(f"fake powershell: unsupported script: {script}")
