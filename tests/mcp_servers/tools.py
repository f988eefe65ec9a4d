"""The tools both test MCP servers offer, written with the official SDK's MCPServer."""

from __future__ import annotations

import os
import time

from mcp.server.mcpserver import MCPServer


def make_server(name: str) -> MCPServer:
    server = MCPServer(name, log_level="WARNING")

    @server.tool(description="Add two integers and return their sum.")
    def add(a: int, b: int) -> int:
        return a + b

    @server.tool(description="Wait this many seconds, then say so (for timeouts).")
    def slow(seconds: float) -> str:
        time.sleep(seconds)
        return f"waited {seconds} s"

    @server.tool(description="End the server process at once, as a crash (for failures mid-call).")
    def crash() -> str:
        os._exit(3)

    return server
