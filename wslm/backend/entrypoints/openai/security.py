"""Who may talk to the server from a browser, and under which host name.

A local server is reachable by any web page the user opens: the page's JavaScript can POST to
http://127.0.0.1:8000 (a "simple" request needs no CORS preflight, and we read any body as JSON), and with
DNS rebinding (attacker.com re-resolving to 127.0.0.1, Ollama's CVE-2024-28224) it can even read the answers.
So, by default:
- a request that carries an Origin header is served only when that origin is a loopback one
  (http://localhost:*, http://127.0.0.1:*, http://[::1]:*) or listed in --allowed-origins (vLLM's flag;
  ["*"] allows any). Requests without Origin (curl, the openai client, the GUI) are not browser requests
  and pass;
- when the server listens on loopback only, the Host header must name loopback (localhost, 127.x.x.x,
  [::1], *.localhost) or a name in --allowed-hosts: a rebound domain's requests carry the attacker's name."""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from wslm.backend.entrypoints.openai.errors import APIError

LOOPBACK_ORIGIN_PATTERN = r"https?://(localhost|127(?:\.\d{1,3}){3}|\[::1\])(:\d{1,5})?"
_LOOPBACK_ORIGIN = re.compile(f"^{LOOPBACK_ORIGIN_PATTERN}$", re.IGNORECASE)


def is_loopback(host: str) -> bool:
    """True for names and addresses that only this machine can reach."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_list(value: str | Sequence[str] | None, flag: str) -> list[str] | None:
    """--allowed-origins / --allowed-hosts: a JSON list (vLLM's form, '["*"]') or comma-separated names."""
    if value is None:
        return None
    if not isinstance(value, str):
        return [str(v) for v in value]
    text = value.strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{flag} must be a JSON list like '[\"http://example.com\"]' or names separated by "
                             f"commas, got {value!r} ({exc}).") from exc
        if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
            raise ValueError(f"{flag} must be a list of strings, got {value!r}.")
        return items
    return [x.strip() for x in text.split(",") if x.strip()]


class OriginCheckMiddleware:
    """403 for a browser request from an origin that is not allowed (see the module doc)."""

    def __init__(self, app: ASGIApp, allowed_origins: list[str] | None) -> None:
        self.app = app
        allowed = allowed_origins or []
        self.allow_all = "*" in allowed
        self.allowed = {o.rstrip("/").lower() for o in allowed}

    def allows(self, origin: str) -> bool:
        origin = origin.rstrip("/").lower()
        return self.allow_all or origin in self.allowed or _LOOPBACK_ORIGIN.match(origin) is not None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            origin = _header(scope, b"origin")
            if origin is not None and not self.allows(origin):
                error = APIError(
                    f"Requests from the web page at {origin[:200]} are not allowed: by default only pages served "
                    "from this machine (localhost) may call this server from a browser. To allow that site, start "
                    f"the server with --allowed-origins '[\"{origin[:200]}\"]'.",
                    403, code="origin_not_allowed",
                )
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


class HostCheckMiddleware:
    """403 for a Host header that does not name this machine's loopback (DNS rebinding); used only when the
    server listens on loopback."""

    def __init__(self, app: ASGIApp, allowed_hosts: list[str] | None) -> None:
        self.app = app
        allowed = allowed_hosts or []
        self.allow_all = "*" in allowed
        self.allowed = {h.lower() for h in allowed}

    def allows(self, host_header: str) -> bool:
        host = host_header.strip().lower()
        if host.startswith("[") and "]" in host:
            name = host[: host.index("]") + 1]  # [::1]:8000
        elif host.count(":") == 1:
            name = host.split(":", 1)[0]  # localhost:8000
        else:
            name = host  # a name without a port, or a bare IPv6 address
        return self.allow_all or is_loopback(name) or name in self.allowed or host in self.allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = _header(scope, b"host")
            if host is not None and not self.allows(host):
                error = APIError(
                    f"Host {host[:200]!r} is not this server's name. This server listens on this machine only "
                    "and answers to localhost / 127.0.0.1; a request naming another host is refused (it is how a "
                    "web page could reach it through DNS rebinding). Behind a proxy, pass --allowed-hosts NAME.",
                    403, code="host_not_allowed",
                )
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """The warning for a server reachable from other machines without a key; None when it is not."""
    if api_key or is_loopback(host):
        return None
    return (f"This server listens on {host}, reachable from other machines, and has NO API key: anyone who can "
            "reach this port can use the model. Pass --api-key KEY (or set WSLM_API_KEY), or listen on "
            "127.0.0.1 only (--host 127.0.0.1).")
