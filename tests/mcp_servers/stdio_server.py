"""A stdio MCP server for the tests: `python stdio_server.py` (tools in tools.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from tools import make_server  # noqa: E402

if __name__ == "__main__":
    make_server("wslm-test-stdio").run("stdio")
