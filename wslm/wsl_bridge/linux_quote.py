"""Quoting arguments for the Linux side of ``wsl.exe -d DISTRO -- ARGS``.

wsl.exe does not pass ARGS to Linux as an argv: it splits its own command line with the Windows rules,
joins the pieces with spaces (wrapping each piece that contains a space in double quotes, without
escaping anything inside), and hands the result to the user's default shell as ``$SHELL -c "..."``.
So every argument must be quoted for that shell, and the quoted word must contain no whitespace, or
wsl.exe's own double quotes would turn POSIX single quotes into literal characters.

- plain words (letters, digits, ``_@%+=:,./-``) pass unchanged;
- words without whitespace are single-quoted (POSIX sh, bash, zsh, ksh, dash);
- words with whitespace use ANSI-C quoting ``$'...'`` with ``\\xHH`` escapes (bash, zsh, ksh: the shells
  WSL distros ship as a user's login shell).
"""

from __future__ import annotations

import re

from wslm.wsl_bridge.errors import ValidationError

_PLAIN = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def quote_for_wsl(arg: str) -> str:
    """One argument as a whitespace-free shell word that survives wsl.exe's join and `$SHELL -c`."""
    if not isinstance(arg, str):
        raise ValidationError(f"argument {arg!r} is not a string", "pass command arguments as str")
    if "\x00" in arg:
        raise ValidationError("argument contains a NUL byte", "remove the NUL character")
    if _PLAIN.fullmatch(arg):
        return arg
    if not any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in arg):
        return "'" + arg.replace("'", "'\\''") + "'"
    out = []
    for ch in arg:
        if ch == "\\":
            out.append("\\\\")
        elif ch == "'":
            out.append("\\'")
        elif ch.isspace() or ord(ch) < 32 or ord(ch) == 127:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 256 else f"\\u{code:04x}")
        else:
            out.append(ch)
    return "$'" + "".join(out) + "'"


def quote_all(args: list[str]) -> list[str]:
    return [quote_for_wsl(a) for a in args]
