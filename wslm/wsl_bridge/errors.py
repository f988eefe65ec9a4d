"""Errors raised by the bridge. Each carries the cause (`str(exc)`) and, where there is one, the fix
(`exc.fix`), so that the CLI and the GUI can show both without parsing text."""

from __future__ import annotations


class BridgeError(Exception):
    """Base class: `message` says what went wrong, `fix` what the user can do about it."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def to_dict(self) -> dict[str, str]:
        return {"error": type(self).__name__, "message": self.message, "fix": self.fix}

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.fix}" if self.fix else self.message


class ValidationError(BridgeError, ValueError):
    """A port, distro name, PID or address was rejected before any command ran."""


class NotWindowsError(BridgeError):
    """A Windows-only operation was asked for on another system (and WSLM_WINDOWS_BIN is not set)."""


class ToolNotFoundError(BridgeError):
    """wsl.exe, netsh.exe or powershell.exe is missing."""


class WslError(BridgeError):
    """wsl.exe failed: no distros, unknown distro, distro would not start, a Linux command failed."""


class CommandError(BridgeError):
    """A Windows or Linux command exited with an error; `argv`, `returncode` and `output` say which."""

    def __init__(self, message: str, fix: str = "", *, argv: list[str] | None = None, returncode: int = 0,
                 output: str = "") -> None:
        super().__init__(message, fix)
        self.argv = argv or []
        self.returncode = returncode
        self.output = output


class ElevationRequiredError(CommandError):
    """Windows said "The requested operation requires elevation (Run as administrator)."."""


class ElevationCancelledError(BridgeError):
    """The user declined the UAC prompt; nothing was changed."""


class ApplyError(BridgeError):
    """A step of a plan failed; what was applied before it has been rolled back (see `result`)."""

    def __init__(self, message: str, fix: str = "", *, result: dict | None = None) -> None:
        super().__init__(message, fix)
        self.result = result or {}


class ShareConflictError(BridgeError):
    """Something that is not wslm's already uses what `share on` needs (e.g. a hand-made portproxy rule)."""
