"""`wslm serve`'s engine flags, generated from EngineConfig's fields (vLLM's EngineArgs.add_cli_args idea), so
that a new engine knob is a flag without writing it twice. A field is `--field-name`; its metadata gives the
help, choices and aliases; its annotation gives the type.

Every generated flag defaults to None, meaning "not given": `given()` leaves it out and EngineConfig's own
default applies, so the defaults live in one place."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any

from wslm.backend.config import EngineConfig


def engine_fields() -> tuple[dataclasses.Field, ...]:
    return dataclasses.fields(EngineConfig)


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def default(name: str) -> Any:
    return next(f.default for f in engine_fields() if f.name == name)


def add_engine_flags(groups: dict[str, Any], parser: Any,
                     overrides: dict[str, dict[str, Any]] | None = None) -> None:
    """Add one flag per EngineConfig field to parser, or to groups[name] for the fields named there.
    overrides: argparse keywords per field for what the annotation cannot say (e.g. a parsing type)."""
    hints = typing.get_type_hints(EngineConfig)
    for f in engine_fields():
        kwargs = _kwargs(f, hints[f.name])
        kwargs.update((overrides or {}).get(f.name, {}))
        groups.get(f.name, parser).add_argument(flag_name(f.name), *f.metadata.get("aliases", ()), **kwargs)


def _kwargs(f: dataclasses.Field, hint: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"dest": f.name, "default": None, "help": f.metadata.get("help")}
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    kind = next(a for a in args if a is not type(None))
    if kind is bool:
        # On by default: --x / --no-x (vLLM's --[no-]enable-prefix-caching); off by default: a plain switch.
        kwargs["action"] = argparse.BooleanOptionalAction if f.default else "store_true"
    elif kind in (int, float):
        kwargs["type"] = kind
    if "choices" in f.metadata:
        kwargs["choices"] = list(f.metadata["choices"])
    return kwargs


def given(args: argparse.Namespace) -> dict[str, Any]:
    """EngineConfig's keywords from the flags given (None: not given, the field's default applies)."""
    return {f.name: v for f in engine_fields() if (v := getattr(args, f.name, None)) is not None}
