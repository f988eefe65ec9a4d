"""vLLM's argument conveniences for `wslm serve` (what vLLM's FlexibleArgumentParser does), so that vLLM
launch scripts and config files work unchanged:

- `--config FILE`: a YAML mapping of flags, keys being flag names without the dashes (`max_model_len` or
  `max-model-len`). Flags given on the command line win over the file. `true` gives a switch, `false` its
  `--no-` form (or nothing), a list a flag's several values (or JSON for a flag that takes one), a mapping
  JSON. A key that is no flag is an error naming it.
- underscores in flag names: `--max_model_len 4096` is `--max-model-len 4096` (never an abbreviation: a
  shortened flag stays an error)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

_UNSET = object()


def normalize_flag_names(argv: list[str]) -> list[str]:
    """`--max_model_len=5` -> `--max-model-len=5` (values untouched; nothing after a bare `--`)."""
    out = []
    for i, arg in enumerate(argv):
        if arg == "--":
            return out + argv[i:]
        if arg.startswith("--") and "_" in arg.partition("=")[0]:
            name, eq, value = arg.partition("=")
            arg = name.replace("_", "-") + eq + value
        out.append(arg)
    return out


def _pop_config(argv: list[str]) -> tuple[list[str], list[str]]:
    """(config files given, argv without them)."""
    files, rest, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest += argv[i:]
            break
        if arg == "--config" and i + 1 < len(argv):
            files.append(argv[i + 1])
            i += 2
            continue
        if arg.startswith("--config="):
            files.append(arg.partition("=")[2])
        else:
            rest.append(arg)
        i += 1
    return files, rest


class ServeArgumentParser(argparse.ArgumentParser):
    def parse_known_args(self, args: Any = None, namespace: Any = None):  # type: ignore[override]
        argv = normalize_flag_names(list(sys.argv[1:] if args is None else args))
        files, argv = _pop_config(argv)
        for path in files:
            argv = argv + self._config_args(path, argv)
        return super().parse_known_args(argv, namespace)

    def _fail(self, message: str) -> None:
        self.exit(2, f"{self.prog}: error: {message}\n")

    def _config_args(self, path: str, cli: list[str]) -> list[str]:
        """The file's flags that the command line does not give, as arguments (after the command line's)."""
        import yaml

        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            self._fail(f"--config {path}: cannot read it ({exc.strerror or exc}).")
        except yaml.YAMLError as exc:
            self._fail(f"--config {path} is not valid YAML: {' '.join(str(exc).split())}")
        if data is None:
            return []
        if not isinstance(data, dict):
            self._fail(f"--config {path} must be a YAML mapping of flag names to values, e.g. `max_model_len: 4096`.")
        given = self._given_on(cli)
        out: list[str] = []
        for key, value in data.items():
            name = str(key).strip().lstrip("-").replace("_", "-")
            flag = "--" + name
            action = self._option_string_actions.get(flag)
            if action is None or name == "config":
                self._fail(f"--config {path}: `{key}` is not a flag of `wslm serve` (keys are flag names without "
                           "the dashes, e.g. max_model_len; see `wslm serve --help`).")
            if action.dest in given or (action.dest == "model" and "model_tag" in given):
                continue  # the command line wins
            out += _as_args(flag, action, value)
        return out

    def _given_on(self, cli: list[str]) -> set[str]:
        """The destinations the command line sets (parsed alone, onto a namespace that marks the rest)."""
        marked = argparse.Namespace(**{a.dest: _UNSET for a in self._actions if a.dest != argparse.SUPPRESS})
        ns, _ = super().parse_known_args(list(cli), marked)
        return {k for k, v in vars(ns).items() if v is not _UNSET and not (k == "model_tag" and v is None)}


def _as_args(flag: str, action: argparse.Action, value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, bool):
        if action.nargs in (0, "?"):
            if value:
                return [flag]
            no = "--no-" + flag[2:]
            return [no] if no in action.option_strings else []
        return [f"{flag}={str(value).lower()}"]
    if isinstance(value, list):
        if action.nargs in ("+", "*"):
            return [flag, *(json.dumps(v) if isinstance(v, (dict, list)) else str(v) for v in value)]
        return [f"{flag}={json.dumps(value)}"]
    if isinstance(value, dict):
        return [f"{flag}={json.dumps(value)}"]
    return [f"{flag}={value}"]
