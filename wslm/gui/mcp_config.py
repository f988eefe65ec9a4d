"""mcp.json: the MCP servers the chat may use, in the `mcpServers` shape Claude Desktop, LM Studio, Cursor and
Cline write, so their files can be imported (or copied in) as they are.

    {"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/home/me"],
                  "env": {"KEY": "value"}, "cwd": "/home/me"},
        "remote": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ..."}},
        "off": {"command": "uvx", "args": ["some-server"], "disabled": true}}}

Beyond the common keys, wslm reads Cline's `disabled` and `alwaysAllow` (tools called without asking) and its
own `timeout` (seconds a tool call may take). Keys it does not know are kept as they were when saving.
No Qt here."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from wslm.paths import config_dir

CONFIG_FILE = "mcp.json"
DEFAULT_TIMEOUT_S = 60.0
_KNOWN = {"command", "args", "env", "cwd", "url", "headers", "disabled", "alwaysAllow", "timeout", "type"}
_HTTP_TYPES = {"http", "streamable-http", "streamableHttp", "streamable_http"}


class McpConfigError(ValueError):
    """mcp.json (or a file being imported) cannot be read: the message names the file and the fix."""


@dataclass
class ServerConfig:
    name: str
    command: str = ""  # stdio servers: the program started, args and env for it, in cwd
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    url: str = ""  # streamable-HTTP servers: the endpoint, and headers sent with each request
    headers: dict[str, str] = field(default_factory=dict)
    enabled: bool = True
    always_allow: list[str] = field(default_factory=list)  # tools called without asking first
    timeout_s: float = DEFAULT_TIMEOUT_S
    extra: dict = field(default_factory=dict)  # keys of other apps, kept as they were

    @property
    def transport(self) -> str:
        return "http" if self.url else "stdio"

    def summary(self) -> str:
        """One line for lists: the command line or the URL."""
        return self.url if self.url else " ".join([self.command, *self.args]).strip()

    def check(self) -> str:
        """Why this entry cannot be used ("" when it can)."""
        if not self.url and not self.command:
            return f"MCP server {self.name!r} has neither a command (stdio) nor a url (streamable HTTP)."
        if self.url and not re.match(r"^https?://", self.url):
            return f"MCP server {self.name!r}: url must start with http:// or https:// (got {self.url!r})."
        return ""

    def to_json(self) -> dict:
        out = dict(self.extra)
        if self.url:
            out["url"] = self.url
            if self.headers:
                out["headers"] = dict(self.headers)
        else:
            out["command"] = self.command
            out["args"] = list(self.args)
            if self.env:
                out["env"] = dict(self.env)
            if self.cwd:
                out["cwd"] = self.cwd
        if not self.enabled:
            out["disabled"] = True
        if self.always_allow:
            out["alwaysAllow"] = list(self.always_allow)
        if self.timeout_s != DEFAULT_TIMEOUT_S:
            out["timeout"] = self.timeout_s
        return out

    @classmethod
    def from_json(cls, name: str, data: dict, source: str = CONFIG_FILE) -> ServerConfig:
        if not isinstance(data, dict):
            raise McpConfigError(f"{source}: mcpServers.{name} must be an object with a command or a url.")
        kind = str(data.get("type") or "")
        if kind == "sse":
            raise McpConfigError(f"{source}: mcpServers.{name} uses the old SSE transport, which wslm does not "
                                 "speak; use the server's streamable-HTTP endpoint (usually …/mcp) instead.")
        url = str(data.get("url") or data.get("serverUrl") or "")
        if kind in _HTTP_TYPES and not url:
            raise McpConfigError(f"{source}: mcpServers.{name} is an HTTP server without a url.")
        args = data.get("args") or []
        if not isinstance(args, list):
            raise McpConfigError(f"{source}: mcpServers.{name}.args must be a list of strings.")
        for key in ("env", "headers"):
            if not isinstance(data.get(key) or {}, dict):
                raise McpConfigError(f"{source}: mcpServers.{name}.{key} must be an object of strings.")
        try:
            timeout = float(data.get("timeout") or DEFAULT_TIMEOUT_S)
        except (TypeError, ValueError):
            raise McpConfigError(f"{source}: mcpServers.{name}.timeout must be a number of seconds.") from None
        extra = {k: v for k, v in data.items() if k not in _KNOWN and k != "serverUrl"}
        if kind and kind not in _HTTP_TYPES and kind != "stdio":
            extra["type"] = kind
        return cls(
            name=name, command=str(data.get("command") or ""), args=[str(a) for a in args],
            env={str(k): str(v) for k, v in (data.get("env") or {}).items()}, cwd=str(data.get("cwd") or ""),
            url=url, headers={str(k): str(v) for k, v in (data.get("headers") or {}).items()},
            enabled=not data.get("disabled", False),
            always_allow=[str(t) for t in data.get("alwaysAllow") or []],
            timeout_s=timeout if timeout > 0 else DEFAULT_TIMEOUT_S, extra=extra,
        )


def default_path() -> Path:
    return config_dir() / CONFIG_FILE


@dataclass
class McpConfig:
    servers: dict[str, ServerConfig] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)  # top-level keys of other apps (e.g. Claude Desktop's)
    path: Path | None = None

    @classmethod
    def load(cls, path: Path | None = None) -> McpConfig:
        """mcp.json (an empty config when there is none yet)."""
        path = Path(path) if path else default_path()
        if not path.exists():
            return cls(path=path)
        cfg = cls.parse(path)
        cfg.path = path
        return cfg

    @classmethod
    def parse(cls, path: Path) -> McpConfig:
        """Read a file in the mcpServers shape (ours, LM Studio's mcp.json, claude_desktop_config.json)."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8-sig"))
        except OSError as exc:
            raise McpConfigError(f"Cannot read {path}: {exc.strerror or exc}.") from None
        except ValueError as exc:
            raise McpConfigError(f"{path} is not valid JSON ({exc}); fix it in a text editor or remove it.") from None
        if not isinstance(data, dict) or not isinstance(data.get("mcpServers", {}), dict):
            raise McpConfigError(f"{path} has no \"mcpServers\" object: it is not an MCP configuration file.")
        servers = {str(n): ServerConfig.from_json(str(n), d, str(path)) for n, d in data.get("mcpServers", {}).items()}
        return cls(servers=servers, extra={k: v for k, v in data.items() if k != "mcpServers"})

    def to_json(self) -> dict:
        return {**self.extra, "mcpServers": {n: s.to_json() for n, s in self.servers.items()}}

    def save(self, path: Path | None = None) -> Path:
        """Write atomically (a crash mid-write leaves the old file)."""
        path = Path(path or self.path or default_path())
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        self.path = path
        return path

    def enabled(self) -> list[ServerConfig]:
        return [s for s in self.servers.values() if s.enabled and not s.check()]

    def import_file(self, path: Path, replace: bool = False) -> list[str]:
        """Add the servers of another app's file; a name already here gets a suffix unless `replace`.
        Returns the names added."""
        other = McpConfig.parse(Path(path))
        added = []
        for name, server in other.servers.items():
            new = name
            if not replace:
                i = 2
                while new in self.servers:
                    new, i = f"{name}-{i}", i + 1
            server.name = new
            self.servers[new] = server
            added.append(new)
        return added


def import_candidates() -> list[Path]:
    """Other apps' MCP files that exist on this machine (LM Studio's, Claude Desktop's), offered by the Tools
    page's Import button (a Windows app's file, under /mnt/c/Users/..., is picked in the file dialog)."""
    home = Path.home()
    found = [home / ".lmstudio" / "mcp.json", home / ".config" / "Claude" / "claude_desktop_config.json",
             home / "Library" / "Application Support" / "Claude" / "claude_desktop_config.json"]
    return [p for p in found if p.is_file()]
