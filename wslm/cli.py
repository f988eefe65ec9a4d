"""The `wslm` command. Each feature registers its own subcommands; heavy imports stay inside handlers
so that `wslm share status` does not load torch."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from wslm import __version__

# module path -> each exposes register(subparsers) which adds parsers with set_defaults(func=handler).
COMMAND_MODULES = [
    "wslm.backend.entrypoints.cli.serve",  # serve
    "wslm.backend.entrypoints.cli.generate",  # generate, chat (quick terminal use of the engine)
    "wslm.backend.hub.cli",  # models list|pull|rm|info
    "wslm.backend.entrypoints.cli.doctor",  # doctor
    "wslm.wsl_bridge.cli",  # wsl, share
    "wslm.gui.cli",  # gui
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wslm", description="Local LLM manager for WSL2.")
    parser.add_argument("--version", action="version", version=f"wslm {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            # A feature whose optional dependencies are missing must not break the other commands.
            if exc.name and (exc.name == name or name.startswith(exc.name)):
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
