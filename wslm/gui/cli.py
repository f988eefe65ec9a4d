"""`wslm gui`: the desktop app. PySide6 is imported inside the handler so other commands stay light."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("gui", help="the desktop app (chat, models, server, LAN sharing)")
    p.add_argument("--screenshot", metavar="DIR", help="render each panel to DIR/<panel>.png and exit")
    p.set_defaults(func=handler)


def handler(args: argparse.Namespace) -> int:
    try:
        from wslm.gui.app import run
    except ImportError as exc:
        import sys

        print(f"wslm gui needs PySide6 ({exc}). Install it with: pip install 'wslm[gui]'", file=sys.stderr)
        return 1
    return run(args.screenshot)
