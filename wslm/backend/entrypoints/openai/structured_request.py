"""Structured output in a request: OpenAI's `response_format`, vLLM's `structured_outputs` and its older
`guided_*` extras, all turned into one StructuredOutputsParams; and the ahead-of-time compile (a 400 that
names the problem for a bad schema, regex or grammar)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from wslm.backend.entrypoints.openai.errors import bad_request
from wslm.backend.structured.params import StructuredOutputsParams

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
_SPEC_FIELDS = {f.name for f in fields(StructuredOutputsParams)}


def structured_outputs_from_request(req: Any) -> tuple[StructuredOutputsParams | None, str | None]:
    """(spec, the request field it came from) or (None, None); a malformed one is a 400."""
    found: list[tuple[str, dict]] = []
    rf = req.response_format
    if rf is not None:
        spec = _from_response_format(rf)
        if spec is not None:
            found.append(("response_format", spec))
    if req.structured_outputs is not None:
        so = req.structured_outputs
        if not isinstance(so, dict):
            raise bad_request("structured_outputs must be an object such as {\"json\": {...}} or {\"regex\": \"...\"}.",
                              param="structured_outputs")
        unknown = sorted(set(so) - _SPEC_FIELDS)
        if unknown:
            raise bad_request(f"structured_outputs has unknown field(s) {', '.join(unknown)}; known: "
                              f"{', '.join(sorted(_SPEC_FIELDS))}.", param="structured_outputs")
        found.append(("structured_outputs", {k: v for k, v in so.items() if v is not None}))
    for name, kind in _GUIDED.items():
        value = getattr(req, name)
        if value is not None:
            spec = {kind: value}
            if getattr(req, "guided_whitespace_pattern", None):
                spec["whitespace_pattern"] = req.guided_whitespace_pattern
            found.append((name, spec))
    if not found:
        return None, None
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise bad_request(f"Only one structured output constraint per request; this one has {names}.",
                          param=found[1][0])
    param, spec = found[0]
    try:
        return StructuredOutputsParams(**spec), param
    except (TypeError, ValueError) as exc:
        raise bad_request(f"{param}: {exc}", param=param) from exc


def _from_response_format(rf: dict) -> dict | None:
    kind = rf.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict):
            raise bad_request('response_format of type "json_schema" needs a `json_schema` object: '
                              '{"name": ..., "schema": {...}, "strict": true}.', param="response_format")
        schema = js.get("schema", js.get("json_schema"))
        if not isinstance(schema, dict):
            raise bad_request("response_format.json_schema.schema must be a JSON schema object.",
                              param="response_format")
        return {"json": schema}
    raise bad_request(f"response_format type {kind!r} is not supported; use \"text\", \"json_object\" or "
                      "\"json_schema\".", param="response_format")
