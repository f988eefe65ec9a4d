"""Turn what an OpenAI-compatible server (or the network) says into one clear sentence with the fix."""

from __future__ import annotations

import json

import httpx

NOT_RUNNING = ("The server is not running. Start it (the chat offers to), or set a URL under Connection in "
               "the chat's settings.")


def _server_message(body: str) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip()[:300]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or err)[:300]
        if isinstance(data.get("detail"), str):
            return data["detail"][:300]
        return str(err)[:300]
    return str(data)[:300]


def describe_http_error(status: int, body: str, base_url: str) -> tuple[str, str]:
    """(kind, message) for an HTTP error reply; kind is auth | context | not_found | server."""
    detail = _server_message(body)
    low = detail.lower()
    if status in (401, 403):
        return "auth", (
            f"The server at {base_url} refused the API key ({status}: {detail or 'unauthorized'}). "
            "Set the right key in the chat's connection settings."
        )
    if "context" in low and ("length" in low or "long" in low or "maximum" in low) or status == 413:
        return "context", (
            f"The conversation is too long for the model's context ({detail}). "
            "Start a new chat, shorten the system prompt or lower max tokens, "
            "or restart the server with a larger context length."
        )
    if status == 404:
        return "not_found", (
            f"{base_url} has no such model or endpoint ({detail or 'not found'}). "
            "Pick a model the server lists, and check the URL ends in /v1."
        )
    return "server", f"The server answered {status}: {detail or 'no details'}"


def describe_transport_error(exc: Exception, base_url: str) -> tuple[str, str]:
    """(kind, message) for a failure to reach the server or a broken stream."""
    if not base_url:  # our server is not running (its URL is only known while it is ready)
        return "down", NOT_RUNNING
    if isinstance(exc, httpx.ConnectError):
        return "down", (
            f"Cannot reach {base_url}: the server is not running or the URL is wrong. "
            "Start it in the Server panel, or fix the URL in the chat's connection settings."
        )
    if isinstance(exc, httpx.TimeoutException):
        return "timeout", f"{base_url} did not answer in time. The server may be overloaded or still loading."
    if isinstance(exc, httpx.RemoteProtocolError):
        return "down", f"The server at {base_url} closed the connection mid-reply (it may have crashed)."
    return "network", f"Request to {base_url} failed: {type(exc).__name__}: {exc}"


def normalize_base_url(url: str) -> str:
    """OpenAI-client style base URL: a bare host:port gets http:// and /v1."""
    url = url.strip().rstrip("/")
    if not url:
        return url
    if "://" not in url:
        url = "http://" + url
    scheme, rest = url.split("://", 1)
    if "/" not in rest:
        url += "/v1"
    return url
