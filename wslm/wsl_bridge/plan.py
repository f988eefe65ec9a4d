"""Plans: the Windows changes an action needs, computed unprivileged, applied in one go.

    plan = Plan("share on", [Step("add portproxy ...", argv=[...], undo=[...]), ...])
    print(plan.to_text())          # what --dry-run prints
    result = apply_plan(plan)      # {"ok": True, "elevated": bool, "steps": [...]}

apply_plan runs the steps directly when the process is elevated (or WSLM_ASSUME_ADMIN=1); otherwise
it starts the elevated helper (elevated.py) once through ``powershell.exe Start-Process -Verb RunAs``,
so the user sees one UAC prompt per action, and reads the helper's results back from a file. A
declined prompt raises ElevationCancelledError and changes nothing; a failed step raises ApplyError
after the helper has rolled back the steps before it. An empty plan runs nothing and prompts for nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from wslm import paths
from wslm.wsl_bridge import elevated, winexec
from wslm.wsl_bridge.errors import ApplyError, BridgeError, ElevationCancelledError

_CANCEL_TEXTS = ("canceled by the user", "cancelled by the user")


@dataclass
class Step:
    description: str
    argv: list[str]
    undo: list[str] | None = None  # restores the state before this step (None: nothing to undo)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Plan:
    action: str
    steps: list[Step] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.steps

    def to_dict(self) -> dict:
        return {"action": self.action, "steps": [s.to_dict() for s in self.steps]}

    def to_text(self) -> str:
        if self.empty:
            return f"{self.action}: nothing to change"
        lines = [f"{self.action}: {len(self.steps)} change(s), applied with administrator rights:"]
        for i, s in enumerate(self.steps, 1):
            lines.append(f"  {i}. {s.description}")
            lines.append(f"     {subprocess.list2cmdline(s.argv)}")
        return "\n".join(lines)


def _check(result: dict, plan: Plan, elevated_run: bool) -> dict:
    result["elevated"] = elevated_run
    if result.get("ok"):
        return result
    rolled = "rolled back, nothing changed" if result.get("rollback_ok", True) else \
        "ROLLBACK FAILED, check `wslm share status`"
    error = result.get("error", "unknown error")
    fix = "see the message above; `wslm share status` shows what is in place"
    if winexec.ELEVATION_TEXT in error.lower():
        fix = "run from an administrator terminal, or let wslm ask for permission (unset WSLM_ASSUME_ADMIN)"
    raise ApplyError(f"{plan.action} failed ({rolled}): {error}", fix, result=result)


def helper_argv(plan_file: Path, result_file: Path, digest: str) -> list[str]:
    """The command the elevated process runs (isolated Python, our helper file by path)."""
    return [sys.executable, "-I", str(Path(elevated.__file__).resolve()), "--plan", str(plan_file),
            "--result", str(result_file), "--sha256", digest]


def _ps_quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def runas_argv(helper: list[str]) -> list[str]:
    """powershell.exe argv that starts `helper` elevated (UAC), waits, and exits with its code."""
    script = ("$ErrorActionPreference='Stop'; "
              f"$p = Start-Process -FilePath {_ps_quote(helper[0])} "
              f"-ArgumentList {_ps_quote(subprocess.list2cmdline(helper[1:]))} "
              "-Verb RunAs -Wait -PassThru -WindowStyle Hidden; exit $p.ExitCode")
    return [winexec.windows_tool("powershell.exe"), "-NoProfile", "-NonInteractive", "-Command", script]


def apply_plan(plan: Plan, timeout: float = 600.0) -> dict:
    """Apply every step (with rollback on failure). See the module docstring."""
    if plan.empty:
        return {"ok": True, "elevated": False, "steps": [], "failed_step": None, "rollback": []}
    steps = [s.to_dict() for s in plan.steps]
    if winexec.is_admin():
        return _check(elevated.execute_plan(steps), plan, False)
    winexec.require_windows(plan.action)
    work = paths.config_dir() / "elevation"
    work.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    plan_file, result_file = work / f"plan-{token}.json", work / f"result-{token}.json"
    raw = json.dumps({"action": plan.action, "steps": steps}).encode("utf-8")
    plan_file.write_bytes(raw)
    try:
        ps = winexec.run(runas_argv(helper_argv(plan_file, result_file, hashlib.sha256(raw).hexdigest())),
                         timeout=timeout)
        if not result_file.exists():
            if any(t in ps.output.lower() for t in _CANCEL_TEXTS):
                raise ElevationCancelledError(
                    f"{plan.action}: administrator permission was declined at the UAC prompt; nothing was changed",
                    "run the command again and choose Yes, or run it from an administrator terminal")
            raise BridgeError(f"{plan.action}: the elevated helper did not report back "
                              f"(powershell exit {ps.returncode}): {ps.output or 'no output'}",
                              "check that Python can run elevated; `wslm share status` shows what is in place")
        result = json.loads(result_file.read_text(encoding="utf-8"))
    finally:
        for f in (plan_file, result_file):
            try:
                os.unlink(f)
            except OSError:
                pass
    return _check(result, plan, True)
