"""StructuredOutputsParams: what a request's output must match (vLLM's class and field names)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
# JSON whitespace allowed between tokens: enough for pretty-printing, but a small model cannot loop on
# newlines until max_tokens (a known failure of unbounded whitespace in vLLM's JSON mode).
MAX_WHITESPACE = 12


@dataclass(slots=True)
class StructuredOutputsParams:
    """Exactly one of json / regex / choice / grammar / json_object / structural_tag.

    json: a JSON schema (dict, or its JSON text). regex: a regular expression the whole output matches.
    choice: the output is exactly one of these strings. grammar: an EBNF grammar (xgrammar's GBNF dialect,
    root rule `root`). json_object: any JSON object. structural_tag: xgrammar's structural tag (JSON text)."""

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None

    def __post_init__(self) -> None:
        set_kinds = [k for k in _KINDS if getattr(self, k) not in (None, False)]
        if len(set_kinds) != 1:
            raise ValueError(
                "structured_outputs needs exactly one of json, regex, choice, grammar, json_object, "
                f"structural_tag; got {', '.join(set_kinds) or 'none'}."
            )
        if self.choice is not None and (
            not isinstance(self.choice, list) or not self.choice or not all(isinstance(c, str) for c in self.choice)
        ):
            raise ValueError(f"choice must be a non-empty list of strings, got {self.choice!r}.")
        for name in ("regex", "grammar", "structural_tag"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty string, got {value!r}.")
        if self.json is not None and not isinstance(self.json, (str, dict)):
            raise ValueError(f"json must be a JSON schema (an object or its JSON text), got {type(self.json).__name__}.")

    @property
    def kind(self) -> str:
        return next(k for k in _KINDS if getattr(self, k) not in (None, False))

    def cache_key(self) -> tuple:
        """Equal for requests that compile to the same grammar (schemas compared as canonical JSON)."""
        value: Any = getattr(self, self.kind)
        if self.kind == "json":
            value = _canonical(value)
        elif self.kind == "choice":
            value = tuple(value)
        return (self.kind, value, self.disable_any_whitespace, self.disable_additional_properties)


def _canonical(schema: str | dict) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            return schema  # the compiler reports the syntax error
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


# vLLM's older name for the same thing (SamplingParams(guided_decoding=GuidedDecodingParams(...))).
GuidedDecodingParams = StructuredOutputsParams
