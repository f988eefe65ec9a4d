"""The elevated helper: runs a plan of Windows commands with rollback, and writes the results to a file.

Started once per action by plan.apply_plan through ``powershell Start-Process -Verb RunAs`` (one UAC
prompt), as ``python -I elevated.py --plan FILE --result FILE --sha256 HEX``. It is self-contained
(standard library only, nothing imported from wslm) because an elevated process does not inherit the
caller's environment or sys.path. It refuses a plan whose bytes do not match the SHA-256 given on
its command line (the file sits in a user-writable folder) and any command outside the allow-list:
netsh portproxy v4tov4 add/set/delete, netsh firewall add/delete of "wslm" rules, and the
New-/Remove-NetFirewallRule and Hyper-V firewall cmdlets on "wslm" rules.

If a step fails, the undo commands of the steps already applied run in reverse order, so a plan is
applied completely or not at all.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys

_PS_HEAD = ["-NoProfile", "-NonInteractive", "-Command"]
_PS_ALLOWED = [
    re.compile(r"^\$ErrorActionPreference='Stop'; New-NetFirewallHyperVRule -Name '(wslm[A-Za-z0-9_.-]*)' "
               r"-DisplayName '\1' -Direction Inbound -VMCreatorId '\{[0-9A-Fa-f-]{36}\}' -Protocol TCP "
               r"-LocalPorts \d{1,5} -Action Allow \| Out-Null$"),
    re.compile(r"^\$ErrorActionPreference='Stop'; Remove-NetFirewallHyperVRule -Name 'wslm[A-Za-z0-9_.-]*'$"),
    re.compile(r"^\$ErrorActionPreference='Stop'; New-NetFirewallRule -Name '(wslm[A-Za-z0-9_.-]*)' -DisplayName '\1' "
               r"-Direction (Inbound|Outbound) -Action (Allow|Block) -Protocol (TCP|UDP) -LocalPort \d{1,5} "
               r"-Profile (Domain|Private|Public|Any)(,(Domain|Private|Public|Any))* "
               r"-RemoteAddress (LocalSubnet|Any|[0-9A-Fa-f][0-9A-Fa-f.:/-]*)(,(LocalSubnet|Any|[0-9A-Fa-f][0-9A-Fa-f.:/-]*))* "
               r"-Enabled (True|False) \| Out-Null$"),
    re.compile(r"^\$ErrorActionPreference='Stop'; Remove-NetFirewallRule -Name 'wslm[A-Za-z0-9_.-]*'$"),
    # A rule an older wslm made with netsh (GUID Name): removed only while its DisplayName is wslm's.
    re.compile(r"^\$ErrorActionPreference='Stop'; Get-NetFirewallRule -Name '\{[0-9A-Fa-f-]{36}\}' \| "
               r"Where-Object \{ \$_\.DisplayName -eq 'wslm[A-Za-z0-9_.-]*' \} \| Remove-NetFirewallRule$"),
]
_NETSH_ARG = re.compile(r"^[A-Za-z]+=[A-Za-z0-9.,/_*-]+$")


def command_allowed(argv: object) -> bool:
    """Whether argv is one of the commands wslm's plans are made of."""
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        return False
    if any(c in a for a in argv for c in "\x00\r\n"):
        return False
    exe = os.path.basename(argv[0].replace("\\", "/")).lower()
    if not (os.path.isabs(argv[0]) or re.match(r"^[A-Za-z]:\\", argv[0])):
        return False
    rest = argv[1:]
    if exe == "netsh.exe":
        if rest[:2] == ["interface", "portproxy"] and len(rest) >= 5 and rest[2] in ("add", "set", "delete") \
                and rest[3] == "v4tov4":
            return all(_NETSH_ARG.fullmatch(a) for a in rest[4:])
        if rest[:2] == ["advfirewall", "firewall"] and len(rest) >= 5 and rest[2] in ("add", "delete") \
                and rest[3] == "rule" and rest[4].startswith("name=wslm"):
            return all(_NETSH_ARG.fullmatch(a) for a in rest[4:])
        return False
    if exe == "powershell.exe":
        return len(rest) == 4 and rest[:3] == _PS_HEAD and any(p.fullmatch(rest[3]) for p in _PS_ALLOWED)
    return False


def _decode(data: bytes) -> str:
    if b"\x00" in data[:200]:
        return data.decode("utf-16-le", errors="replace").replace("\x00", "")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("cp437", errors="replace")


def _run(argv: list[str]) -> dict:
    flags = getattr(subprocess, "CREATE_NO_WINDOW", 0) if os.name == "nt" else 0
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=120, stdin=subprocess.DEVNULL, creationflags=flags)
        rc, out = proc.returncode, (_decode(proc.stdout) + _decode(proc.stderr))
    except (OSError, subprocess.TimeoutExpired) as exc:
        rc, out = 1, str(exc)
    if rc > 2**31:
        rc -= 2**32
    return {"argv": argv, "returncode": rc, "output": out.replace("\r\n", "\n").strip()}


def execute_plan(steps: list[dict]) -> dict:
    """Run each step's argv; on the first failure run the undo argv of the applied steps in reverse.
    Returns {"ok", "steps": [...], "failed_step", "rollback": [...], "rollback_ok"}."""
    for i, step in enumerate(steps):
        for key in ("argv", "undo"):
            if step.get(key) is not None and not command_allowed(step[key]):
                return {"ok": False, "steps": [], "failed_step": i, "rollback": [], "rollback_ok": True,
                        "error": f"step {i} ({step.get('description', '')}): {key} is not a command wslm runs"}
    done: list[dict] = []
    results = []
    for i, step in enumerate(steps):
        res = _run(step["argv"])
        res["description"] = step.get("description", "")
        results.append(res)
        if res["returncode"] != 0:
            rollback = [_run(s["undo"]) | {"description": "undo: " + s.get("description", "")}
                        for s in reversed(done) if s.get("undo")]
            return {"ok": False, "steps": results, "failed_step": i, "rollback": rollback,
                    "rollback_ok": all(r["returncode"] == 0 for r in rollback),
                    "error": f"step {i + 1} failed: {step.get('description', '')}: {res['output']}"}
        done.append(step)
    return {"ok": True, "steps": results, "failed_step": None, "rollback": [], "rollback_ok": True}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="wslm elevated helper (applies a plan)")
    parser.add_argument("--plan", required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--sha256", required=True)
    args = parser.parse_args(argv)
    try:
        with open(args.plan, "rb") as f:
            raw = f.read()
        if hashlib.sha256(raw).hexdigest() != args.sha256.lower():
            result = {"ok": False, "steps": [], "failed_step": None, "rollback": [], "rollback_ok": True,
                      "error": "the plan file changed after it was written; nothing was applied"}
        else:
            result = execute_plan(json.loads(raw.decode("utf-8"))["steps"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        result = {"ok": False, "steps": [], "failed_step": None, "rollback": [], "rollback_ok": True,
                  "error": f"cannot read the plan: {exc}"}
    result["plan_sha256"] = args.sha256.lower()
    tmp = args.result + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f)
    os.replace(tmp, args.result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
