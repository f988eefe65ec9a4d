"""A forgiving scanner for JSON that may still be arriving: where each top-level field of an object starts and
(if it has) ends. The tool parsers use it to stream a call's name as soon as it is whole and its arguments as
they grow, cutting them out of the model's own text, so that the streamed pieces join into exactly the
arguments string a non-streamed reply carries."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

_WS = " \t\r\n"


class NotJSON(ValueError):
    """The text cannot be the JSON the parser expects (so it is plain content, not a tool call)."""


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def string_end(text: str, i: int) -> int | None:
    """text[i] is '"': the index after the closing quote, or None while the string is unfinished."""
    j = i + 1
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == '"':
            return j + 1
        j += 1
    return None


def value_end(text: str, i: int) -> int | None:
    """The index after the JSON value starting at text[i], or None while it is unfinished."""
    if i >= len(text):
        return None
    c = text[i]
    if c == '"':
        return string_end(text, i)
    if c in "{[":
        depth = 0
        j = i
        while j < len(text):
            c = text[j]
            if c == '"':
                end = string_end(text, j)
                if end is None:
                    return None
                j = end
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        return None
    # A number, true, false or null: it ends at the first delimiter (unknown while the text ends with it).
    j = i
    while j < len(text) and text[j] not in _WS + ",}]":
        j += 1
    return j if j < len(text) else None


@dataclass
class ObjectScan:
    fields: dict[str, tuple[int, int | None]] = field(default_factory=dict)  # key -> (value start, end or None)
    end: int | None = None  # the index after the closing brace, once seen


def scan_object(text: str, i: int) -> ObjectScan:
    """text[i] is '{'. Raises NotJSON when what arrived cannot be a JSON object."""
    scan = ObjectScan()
    i = skip_ws(text, i + 1)
    while i < len(text):
        if text[i] == "}":
            scan.end = i + 1
            return scan
        if text[i] != '"':
            raise NotJSON(f"expected a key at {i}")
        key_end = string_end(text, i)
        if key_end is None:
            return scan
        key = json.loads(text[i:key_end])
        i = skip_ws(text, key_end)
        if i >= len(text):
            return scan
        if text[i] != ":":
            raise NotJSON(f"expected ':' at {i}")
        start = skip_ws(text, i + 1)
        if start >= len(text):
            return scan
        end = value_end(text, start)
        scan.fields[key] = (start, end)
        if end is None:
            return scan
        i = skip_ws(text, end)
        if i < len(text):
            if text[i] == ",":
                i = skip_ws(text, i + 1)
            elif text[i] != "}":
                raise NotJSON(f"expected ',' or '}}' at {i}")
    return scan


def partial_suffix(text: str, marker: str) -> int:
    """How many characters at the end of text could be the start of marker (held back while streaming)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0
