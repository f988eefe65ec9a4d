"""A streamable-HTTP MCP server for the tests on a free loopback port: `python http_server.py` binds port 0,
prints {"port": N} on its first stdout line and serves http://127.0.0.1:N/mcp (tools in tools.py)."""

import json
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import anyio  # noqa: E402
import uvicorn  # noqa: E402
from tools import make_server  # noqa: E402


def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound here, before the port is printed: no race for it
    sock.listen(16)
    print(json.dumps({"port": sock.getsockname()[1]}), flush=True)
    app = make_server("wslm-test-http").streamable_http_app()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    anyio.run(lambda: server.serve(sockets=[sock]))


if __name__ == "__main__":
    main()
