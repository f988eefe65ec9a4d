"""installer/windows/install.ps1 cannot run here (no PowerShell: pwsh is not in Debian's or PyPI's
packages), so these tests check its structure the way a careful reviewer would: brackets balance outside
strings and comments, every command it calls is one of its functions or a known cmdlet, no aliases, every
variable is assigned before Set-StrictMode could trip on it, the documented parameters exist, and it
is ASCII (Windows PowerShell 5.1 reads a BOM-less file in the ANSI code page)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.install

SCRIPT = Path(__file__).resolve().parents[2] / "installer" / "windows" / "install.ps1"
CMDLETS = {
    "Set-StrictMode", "Write-Host", "Write-Progress", "Write-Verbose", "Read-Host", "Join-Path", "Test-Path",
    "Get-Content", "Set-Content", "ConvertFrom-Json", "ConvertTo-Json", "New-Item", "Remove-Item", "Copy-Item",
    "Get-ChildItem", "Resolve-Path", "New-Object", "Get-Command", "ForEach-Object", "Where-Object",
    "Start-Process", "Out-Null", "Out-Host", "Get-NetFirewallRule", "Remove-NetFirewallRule",
    "Get-NetFirewallHyperVRule", "Remove-NetFirewallHyperVRule",
}
APPROVED_VERBS = {"Write", "Stop", "Confirm", "Test", "Get", "Invoke", "Select", "ConvertTo", "Read", "Save",
                  "Install", "New", "Remove", "Uninstall"}
AUTOMATIC = {"true", "false", "null", "_", "PSScriptRoot", "LASTEXITCODE", "Matches", "ErrorActionPreference"}


def strip(text: str, keep_double: bool = False) -> str:
    """The code without comments and string contents (double-quoted contents kept with keep_double)."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("<#", i):
            i = text.index("#>", i) + 2
        elif text[i] == "#":
            while i < n and text[i] != "\n":
                i += 1
        elif text[i] == "'":
            i += 1
            while not (text[i] == "'" and not text.startswith("''", i)):
                i += 2 if text.startswith("''", i) else 1
            i += 1
            out.append("''")
        elif text[i] == '"':
            j = i + 1
            while text[j] != '"':
                j += 2 if text[j] == "`" else 1
            out.append(text[i:j + 1] if keep_double else '""')
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


@pytest.fixture(scope="module")
def source() -> str:
    return SCRIPT.read_text(encoding="utf-8")


def test_ascii_and_balanced(source: str):
    assert source.isascii()
    code = strip(source)
    for open_, close in ("()", "{}", "[]"):
        depth = 0
        for ch in code:
            depth += (ch == open_) - (ch == close)
            assert depth >= 0, f"unbalanced {close}"
        assert depth == 0, f"unbalanced {open_}{close}"


def test_parameters(source: str):
    param = re.search(r"\[CmdletBinding\(\)\]\s*param\((.*?)\n\)", source, re.S)
    assert param, "no param block"
    names = set(re.findall(r"\$([A-Za-z]+)", param.group(1)))
    assert names == {"Distro", "Source", "InstallDir", "Uninstall", "SkipGui", "Yes"}
    assert "Set-StrictMode -Version" in source and '$ErrorActionPreference = "Stop"' in source


def test_every_command_is_defined_or_a_cmdlet(source: str):
    code = strip(source)
    defined = set(re.findall(r"^\s*function\s+([A-Za-z]+-[A-Za-z]+)", code, re.M))
    assert {"Install-Wslm", "Uninstall-Wslm", "Remove-SharingRules", "Install-InDistro", "Install-Gui",
            "New-Shortcut", "Get-WslDistros", "Select-Distro"} <= defined
    for name in defined:
        assert name.split("-")[0] in APPROVED_VERBS, name
    # The elevated fallback's command is a string: check the cmdlets inside it too.
    used = set(re.findall(r"(?<![\w$.:-])([A-Z][a-z]+(?:To)?-[A-Z][A-Za-z]+)\b", strip(source, keep_double=True)))
    unknown = used - defined - CMDLETS
    assert not unknown, f"called but neither defined nor a known cmdlet: {sorted(unknown)}"
    for name in defined:
        calls = re.findall(rf"(?<![\w-]){re.escape(name)}\b", code)
        assert len(calls) >= 2, f"{name} is defined but never called"


def test_no_aliases_or_shell_strings(source: str):
    code = strip(source)
    aliases = r"%|\?|foreach|where|select|sort|ls|dir|cat|echo|iex|gci|gc|ni|ri|rm|cp|mv|curl|wget|sc|sleep"
    assert not re.search(rf"\|\s*({aliases})(\s|$)", code, re.I | re.M)
    assert not re.search(rf"^[ \t]*({aliases})[ \t]+[^(\s]", code, re.I | re.M)  # `foreach (` is the keyword
    assert "Invoke-Expression" not in code and "cmd.exe" not in source and "cmd /c" not in source


def test_variables_are_assigned(source: str):
    text = strip(source, keep_double=True)
    used = {m.group(1) for m in re.finditer(r"\$(?:script:)?\{?([A-Za-z_][A-Za-z0-9_]*)", text)
            if not text[m.start():].startswith("$env:")}
    assigned = set(re.findall(r"\$(?:script:)?([A-Za-z_][A-Za-z0-9_]*)\s*(?:=|\+=)(?!=)", text))
    assigned |= set(re.findall(r"foreach\s*\(\s*\$([A-Za-z_]+)\s+in\b", text))
    assigned |= set(re.findall(r"\[ref\]\$([A-Za-z_]+)", text))
    assigned |= set(re.findall(r"\[[A-Za-z.\[\]]+\]\$([A-Za-z_]+)", text))  # typed parameters
    missing = used - assigned - AUTOMATIC
    assert not missing, f"used but never assigned: {sorted(missing)}"


def test_uninstall_touches_only_wslm_rules(source: str):
    body = source[source.index("function Remove-SharingRules"):source.index("function Uninstall-Wslm")]
    assert '@("share", "off", "--port", [string]$port)' in body
    assert body.count('StartsWith("wslm")') == 2 and body.count("StartsWith('wslm')") == 2
    assert "Remove-NetFirewallRule" in body and "netsh" not in body  # portproxy only through `wslm share off`


@pytest.mark.skipif(not shutil.which("pwsh"), reason="pwsh is not installed")
def test_parses_with_pwsh():
    check = ("$e = $null; [System.Management.Automation.Language.Parser]::ParseFile("
             f"'{SCRIPT}', [ref]$null, [ref]$e) | Out-Null; if ($e) {{ $e; exit 1 }}")
    proc = subprocess.run(["pwsh", "-NoProfile", "-Command", check], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
