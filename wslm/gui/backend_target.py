"""Where the backend runs, stored in the settings as {"kind": "local"} or {"kind": "wsl", "distro": "..."}.

A thin layer over wslm.wsl_bridge.launcher.Target: that builds every argv (wsl.exe quoting, PIDs),
the GUI only stores the choice and runs the argv with QProcess."""

from __future__ import annotations

from wslm.wsl_bridge.launcher import Target


def target_from_settings(data: dict | None) -> Target:
    data = data or {}
    if not data.get("kind"):
        return Target.default()  # not chosen yet
    if data.get("kind") == "wsl":
        try:
            return Target.wsl(data.get("distro") or None)
        except ValueError:  # an invalid distro name in a hand-edited file
            return Target.wsl()
    return Target.local()


def target_to_settings(target: Target) -> dict:
    if not target.via_wsl:
        return {"kind": "local"}
    return {"kind": "wsl", "distro": target.distro or ""}


def target_label(target: Target) -> str:
    if not target.via_wsl:
        return "This machine"
    return f"WSL: {target.distro}" if target.distro else "WSL: default distro"
