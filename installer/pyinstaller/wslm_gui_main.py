"""Entry point of the packaged app (wslm-gui.exe): the desktop app by default, any other `wslm` command
(e.g. `wslm-gui.exe share off --port 8000`, which install.ps1 -Uninstall runs) when one is given.

The app re-runs itself the way it would run Python: `sys.executable -m wslm ...` (local target) and
`sys.executable -I .../elevated.py ...` (the elevated LAN-sharing helper). In the bundle sys.executable
is this program, so both forms are mapped back here."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    if argv[:2] == ["-m", "wslm"]:
        argv = argv[2:]
    elif argv[:1] == ["-I"] and len(argv) > 1 and argv[1].replace("\\", "/").endswith(
            ("wsl_bridge/elevated.py", "wsl_bridge/elevated.pyc")):  # its __file__ inside the bundle
        from wslm.wsl_bridge import elevated

        return elevated.main(argv[2:])
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version", "-v", "--verbose")):
        argv = ["gui", *argv]  # no command: the app (flags like --screenshot DIR are the app's)
    from wslm.cli import main as wslm_main

    return wslm_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
