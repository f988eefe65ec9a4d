"""Limits on the HTTP request itself, before any field is looked at: the request head (431 past
--max-header-count headers or --max-header-bytes; http_protocol.py enforces it while the head arrives, the
middleware here on a head that came whole), body size (413, enforced while the body
is read, so a huge upload is cut off instead of buffered) and a JSON reader that refuses what Python's json
would take but nothing downstream should see: nesting deeper than --max-json-depth (never a RecursionError
500), NaN/Infinity and numbers that overflow to infinity, and lone UTF-16 surrogates (which tokenizers
cannot encode)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from wslm.backend.entrypoints.openai.errors import APIError, bad_request

DEFAULT_MAX_REQUEST_BODY_BYTES = 8 * 2**20  # a long chat with a 100k-token context is ~1 MB of JSON
DEFAULT_MAX_JSON_DEPTH = 64  # deep enough for any JSON schema a client sends with tools / structured output
# Browsers and SDKs send 10-30 headers in 1-4 KB; nginx and Node stop near these numbers too.
DEFAULT_MAX_HEADER_COUNT = 100
DEFAULT_MAX_HEADER_BYTES = 16 * 2**10
DEFAULT_REQUEST_HEAD_TIMEOUT = 10.0  # seconds; a real client sends its head at once


@dataclass(slots=True)
class HTTPLimits:
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    max_header_count: int = DEFAULT_MAX_HEADER_COUNT
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES  # the request line and the header lines together
    request_head_timeout: float = DEFAULT_REQUEST_HEAD_TIMEOUT


# The process-wide limits, set once by build_app() from the server's flags: request parsers read them here.
current = HTTPLimits()


def too_large(limit: int) -> APIError:
    return APIError(
        f"The request body is larger than this server's limit of {limit} bytes. Send a smaller "
        "request, or start the server with a larger --max-request-body-bytes.",
        413,
        code="request_too_large",
    )


def head_too_large(count: int, size: int, limits: HTTPLimits) -> APIError | None:
    """The 431 for a request head of `count` headers and `size` bytes, or None when it is within limits."""
    if count > limits.max_header_count:
        what = f"{count} headers; this server takes at most {limits.max_header_count} (--max-header-count)"
    elif size > limits.max_header_bytes:
        what = (f"{size} bytes of request line and headers; this server takes at most {limits.max_header_bytes} "
                "(--max-header-bytes)")
    else:
        return None
    return APIError(f"The request has {what}. Send fewer or shorter headers, or start the server with a larger "
                    "limit.", 431, code="request_header_fields_too_large")


class HeaderLimitMiddleware:
    """431 for a request head over the limits. http_protocol.py refuses one while it is still arriving; a
    head that came whole in one read was parsed before it could be counted, and is refused here."""

    def __init__(self, app: ASGIApp, limits: HTTPLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = scope["headers"]
            # As sent: "METHOD target HTTP/1.1\r\n", then "name: value\r\n" per header, then "\r\n".
            target = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") + 1
            size = len(scope["method"]) + target + 12 + sum(len(n) + len(v) + 4 for n, v in headers) + 2
            error = head_too_large(len(headers), size, self.limits)
            if error is not None:
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodySizeLimitMiddleware:
    """413 for a body over the limit: at once from Content-Length, else as soon as the bytes read pass it.
    The body is read here in full (it is at most the limit) and replayed to the app, so that the app never
    starts on a request it then cannot finish reading."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.max_bytes:
                    await too_large(self.max_bytes).response()(scope, receive, send)
                    return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left while sending
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await too_large(self.max_bytes).response()(scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # then http.disconnect, which handlers watch for

        await self.app(scope, replay, send)


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"the number {text[:40]} is too large")
    return value


# Only a \uD800-\uDFFF escape can put a surrogate into a parsed string (raw UTF-8 bytes never decode to one).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def load_json(raw: bytes, max_depth: int | None = None) -> Any:
    """The parsed body; a 400 naming the problem for anything a strict JSON reader would refuse."""
    max_depth = current.max_json_depth if max_depth is None else max_depth
    try:
        # Decoded here, strictly: json.loads(bytes) would let UTF-8-encoded surrogates through ("surrogatepass").
        text = raw.decode("utf-8-sig")
        data = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise _too_deep(max_depth) from None
    except UnicodeDecodeError as exc:
        raise bad_request(f"The request body is not valid UTF-8 ({exc}). Send JSON encoded as UTF-8.") from exc
    except ValueError as exc:
        raise bad_request(f"The request body is not valid JSON: {exc}.") from exc
    surrogates = _SURROGATE_ESCAPE.search(raw) is not None
    if surrogates or raw.count(b"[") + raw.count(b"{") > max_depth:
        _check_tree(data, max_depth, surrogates)
    return data


def _too_deep(max_depth: int) -> APIError:
    return bad_request(
        f"The request body is nested deeper than {max_depth} levels. Flatten it, or start the "
        "server with a larger --max-json-depth."
    )


def _check_tree(data: Any, max_depth: int, strings: bool) -> None:
    """Depth of nested arrays/objects, and (when the body had surrogate escapes) lone surrogates in strings.
    Iterative: a recursive walk is what this guards against."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            if depth > max_depth:
                raise _too_deep(max_depth)
            for key, item in value.items():
                if strings and _SURROGATE.search(key):
                    raise _lone_surrogate()
                stack.append((item, depth + 1))
        elif isinstance(value, list):
            if depth > max_depth:
                raise _too_deep(max_depth)
            stack.extend((item, depth + 1) for item in value)
        elif strings and isinstance(value, str) and _SURROGATE.search(value):
            raise _lone_surrogate()


def _lone_surrogate() -> APIError:
    return bad_request(
        "The request body contains a lone UTF-16 surrogate escape (\\ud800-\\udfff without its "
        "pair): that is not text. Send valid Unicode."
    )
