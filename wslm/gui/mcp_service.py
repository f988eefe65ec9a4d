"""MCP for the GUI: mcp.json and the connections (mcp_client.McpManager, on its own thread) behind Qt signals.

One instance serves the app: the Tools page edits it, the chat's tool loop offers its tools and calls them."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, Signal

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.mcp_client import McpManager, ServerStatus, ToolInfo, ToolResult
from wslm.gui.mcp_config import McpConfig, McpConfigError, ServerConfig


class McpService(QObject):
    server_changed = Signal(str)  # a server's status or tools changed (name); emitted on the GUI thread
    config_changed = Signal()  # servers added, removed, edited, enabled or disabled
    call_finished = Signal(str, dict)  # call id, ToolResult.as_dict()

    def __init__(self, path: Path | None = None, parent=None, connect: bool = True) -> None:
        super().__init__(parent)
        self.load_error = ""  # mcp.json could not be read: said on the Tools page, the file left untouched
        try:
            self.config = McpConfig.load(path)
        except McpConfigError as exc:
            self.load_error = str(exc)
            self.config = McpConfig(path=None)
        # Signals emitted on the MCP thread reach receivers on the GUI thread queued (AutoConnection).
        self.manager = McpManager(on_change=self.server_changed.emit)
        if connect:
            self.manager.apply(list(self.config.servers.values()))

    # Config
    def servers(self) -> list[ServerConfig]:
        return list(self.config.servers.values())

    def server(self, name: str) -> ServerConfig | None:
        return self.config.servers.get(name)

    def save(self) -> None:
        """Write mcp.json and (re)connect what changed. Not when it could not be read (never overwrite a file
        the user may be fixing)."""
        if not self.load_error:
            self.config.save()
        self.manager.apply(self.servers())
        self.config_changed.emit()

    def put(self, server: ServerConfig, old_name: str | None = None) -> None:
        """Add a server, or replace `old_name`'s entry (renamed or edited), keeping the list's order."""
        items = list(self.config.servers.items())
        if old_name and old_name in self.config.servers:
            items = [(server.name, server) if n == old_name else (n, s) for n, s in items]
            self.config.servers = dict(items)
        else:
            self.config.servers[server.name] = server
        self.save()

    def remove(self, name: str) -> None:
        if self.config.servers.pop(name, None) is not None:
            self.save()

    def set_enabled(self, name: str, enabled: bool) -> None:
        server = self.config.servers.get(name)
        if server is not None and server.enabled != enabled:
            server.enabled = enabled
            self.save()

    def import_file(self, path: Path) -> list[str]:
        """Add another app's servers (LM Studio's mcp.json, Claude Desktop's config); raises McpConfigError."""
        added = self.config.import_file(path)
        if added:
            self.save()
        return added

    def reconnect(self, name: str) -> None:
        self.manager.reconnect(name)

    # Status and tools
    def status(self, name: str) -> ServerStatus:
        return self.manager.status(name)

    def tools(self) -> list[ToolInfo]:
        return self.manager.tools()

    def openai_tools(self) -> list[dict]:
        return self.manager.openai_tools()

    def resolve(self, function: str) -> tuple[str, str] | None:
        return self.manager.resolve(function)

    def is_always_allowed(self, function: str) -> bool:
        target = self.resolve(function)
        server = self.config.servers.get(target[0]) if target else None
        return bool(server and target[1] in server.always_allow)

    def allow_always(self, function: str) -> None:
        """Call this tool without asking from now on (kept in mcp.json as Cline's alwaysAllow)."""
        target = self.resolve(function)
        server = self.config.servers.get(target[0]) if target else None
        if server is not None and target[1] not in server.always_allow:
            server.always_allow.append(target[1])
            self.save()

    def call(self, call_id: str, function: str, arguments: dict) -> None:
        """Call a tool off the GUI thread; call_finished(call_id, result) says how it went."""
        future = self.manager.call(function, arguments)

        def done(f) -> None:
            try:
                result = f.result()
            except BaseException as exc:  # noqa: BLE001 - the loop was stopped under it (app closing)
                result = ToolResult(f"The call did not finish: {exc}", True, "failed")
            self.call_finished.emit(call_id, result.as_dict())

        future.add_done_callback(done)

    def close(self) -> None:
        self.manager.close()
