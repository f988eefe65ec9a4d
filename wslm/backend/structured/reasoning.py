"""Structured output for a model that reasons first: the constraint applies after the think block, as in vLLM
(with a reasoning parser, its grammar starts once `</think>` is written), so a thinking model still thinks
before it answers in JSON. One xgrammar structural tag says it: `[<think>] any text </think>`, optional
whitespace, then the constraint; a model that may skip thinking (Qwen3 opens the block itself) may also
answer at once. A constraint that itself writes `</think>` describes the whole reply and is left alone."""

from __future__ import annotations

import json
from typing import Any

from wslm.backend.structured.params import MAX_WHITESPACE, StructuredOutputsParams

THINK_START = "<think>"
THINK_END = "</think>"


def after_reasoning(spec: StructuredOutputsParams, starts_inside: bool) -> StructuredOutputsParams:
    """spec, applied only after the reply's think block. starts_inside: the prompt opened the block (or the
    model always reasons, as DeepSeek-R1's), so the reply begins with reasoning and no `<think>` of its own."""
    inner = _format(spec)
    if inner is None or THINK_END in json.dumps(inner):
        return spec  # a structural tag, or a constraint that itself writes `</think>`: it spells out the whole reply
    think = {"type": "tag", "begin": "" if starts_inside else THINK_START, "content": {"type": "any_text"},
             "end": THINK_END}
    reply: dict[str, Any] = {"type": "sequence", "elements": [think, {"type": "regex", "pattern": r"[ \t\r\n]*"},
                                                              inner]}
    if not starts_inside:
        reply = {"type": "or", "elements": [reply, inner]}
    return StructuredOutputsParams(structural_tag=json.dumps({"type": "structural_tag", "format": reply}))


def _format(spec: StructuredOutputsParams) -> dict | None:
    """The constraint as a structural-tag format (the same grammar the compiler builds for it alone)."""
    kind = spec.kind
    if kind in ("json", "json_object"):
        import xgrammar as xgr  # the JSON grammar the compiler builds for the spec alone, written as EBNF

        schema = '{"type": "object"}' if kind == "json_object" else (
            spec.json if isinstance(spec.json, str) else json.dumps(spec.json))
        try:
            grammar = xgr.Grammar.from_json_schema(schema, any_whitespace=not spec.disable_any_whitespace,
                                                   max_whitespace_cnt=MAX_WHITESPACE, strict_mode=kind == "json")
        except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError for a bad schema
            from wslm.backend.structured.compiler import GrammarError, _clean

            raise GrammarError(f"Invalid JSON schema: {_clean(exc)}", param=kind) from None
        return {"type": "grammar", "grammar": str(grammar)}
    if kind == "regex":
        return {"type": "regex", "pattern": spec.regex}
    if kind == "choice":
        return {"type": "or", "elements": [{"type": "const_string", "value": c} for c in spec.choice]}
    if kind == "grammar":
        return {"type": "grammar", "grammar": spec.grammar}
    return None
