"""Fake powershell.exe for the few scripts the bridge runs: Start-Process -Verb RunAs (UAC),
network addresses/profiles, and the Hyper-V firewall cmdlets."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from .common import elevated, injected_failure, locked_state, record, split_windows_cmdline

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


def _cmdlet(st: dict, script: str) -> int:
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
