"""The MCP client side of the chat: connects to the enabled servers of mcp.json with the official `mcp` SDK,
lists their tools and calls them. No Qt here (mcp_service.py brings it to the GUI).

Everything MCP runs on one asyncio loop in a daemon thread; the caller gets concurrent futures and change
callbacks (called on that thread). A server that cannot start, answers too slowly or dies is reported as
an error in its status and in the result of the call it took down, never by blocking the caller."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import re
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from wslm.gui.mcp_config import ServerConfig

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 30.0  # starting a stdio server (npx/uvx may download first) and the handshake
PING_INTERVAL_S = 5.0  # an idle connection pings its server this often: a server that died shows as an error
PING_TIMEOUT_S = 10.0
CONNECTION_CLOSED = -32000  # the SDK's error code for a transport that ended (the server exited, the stream broke)
RESULT_CHARS = 20000  # a tool result longer than this is cut before it goes to the model

OFF, CONNECTING, READY, ERROR = "off", "connecting", "ready", "error"
SDK_INSTALL = "pip install 'mcp>=2.3,<3'"


@dataclass
class ToolInfo:
    server: str
    name: str  # the tool's name on its server
    description: str = ""
    input_schema: dict = field(default_factory=dict)
    function: str = ""  # the name offered to the model (unique across servers)

    def openai(self) -> dict:
        """The tool in the chat request's `tools` (OpenAI function tool)."""
        params = self.input_schema or {"type": "object", "properties": {}}
        return {"type": "function", "function": {"name": self.function or self.name,
                                                 "description": self.description or f"{self.name} ({self.server})",
                                                 "parameters": params}}


@dataclass
class ServerStatus:
    name: str
    state: str = OFF  # off | connecting | ready | error
    tools: list[ToolInfo] = field(default_factory=list)
    error: str = ""  # the last error, kept after a reconnect until the next one succeeds
    server_info: str = ""  # "name version" the server gave at the handshake


@dataclass
class ToolResult:
    text: str
    is_error: bool = False
    kind: str = "ok"  # ok | error (the tool said so) | failed (the server failed) | timeout

    def as_dict(self) -> dict:
        return {"text": self.text, "is_error": self.is_error, "kind": self.kind}


class _Conn:
    """One server's connection: its task on the loop, its session while ready, the calls in flight."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.status = ServerStatus(config.name)
        self.session = None
        self.task: asyncio.Task | None = None
        self.stop: asyncio.Event | None = None
        self.dead: asyncio.Event | None = None  # a call met a closed connection: the server is gone
        self.failing = False  # the connection ended: calls still in flight are failed
        self.death = ""
        self.calls: set[asyncio.Task] = set()
        self.errlog = None  # a stdio server's stderr, read back when it fails


def _sanitize(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "tool"


def describe_error(exc: BaseException) -> str:
    """One readable line for an exception, digging into anyio's exception groups."""
    while getattr(exc, "exceptions", None):  # an exception group (3.10 has no BaseExceptionGroup name)
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        return f"{text}: the command was not found; check it is installed and on PATH (or give its full path)."
    return text


def result_text(result) -> tuple[str, bool]:
    """A CallToolResult as text for the model and the card: its text blocks (others described), or its
    structured content as JSON when it has no text."""
    parts = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "image":
            parts.append(f"[image {getattr(block, 'mime_type', '') or getattr(block, 'mimeType', '')}]")
        elif kind == "resource":
            res = getattr(block, "resource", None)
            parts.append(getattr(res, "text", None) or f"[resource {getattr(res, 'uri', '')}]")
        else:
            parts.append(f"[{kind or 'content'}]")
    structured = getattr(result, "structured_content", None) or getattr(result, "structuredContent", None)
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False))
    text = "\n".join(parts)
    if len(text) > RESULT_CHARS:
        text = text[:RESULT_CHARS] + f"\n… (cut: {len(text)} characters in all)"
    is_error = bool(getattr(result, "is_error", None) or getattr(result, "isError", None))
    return text, is_error


class McpManager:
    """Connections to MCP servers. `on_change(server_name)` is called (on the MCP thread) whenever a
    server's status or tool list changes."""

    def __init__(self, on_change: Callable[[str], None] | None = None) -> None:
        self.on_change = on_change
        self._conns: dict[str, _Conn] = {}
        self._lock = threading.Lock()  # _conns and the tool map, read from the GUI thread
        self._functions: dict[str, tuple[str, str]] = {}  # function name -> (server, tool)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="mcp", daemon=True)
        self._thread.start()

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    # Public API (any thread)
    def apply(self, servers: list[ServerConfig]) -> concurrent.futures.Future:
        """Connect these servers (the enabled ones), dropping the others; a server whose settings changed
        reconnects. Returns at once."""
        return asyncio.run_coroutine_threadsafe(self._apply([ServerConfig(**vars(s)) for s in servers]), self._loop)

    def reconnect(self, name: str) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(self._reconnect(name), self._loop)

    def status(self, name: str) -> ServerStatus:
        with self._lock:
            conn = self._conns.get(name)
            if conn is None:
                return ServerStatus(name)
            s = conn.status
            return ServerStatus(s.name, s.state, list(s.tools), s.error, s.server_info)

    def statuses(self) -> dict[str, ServerStatus]:
        with self._lock:
            names = list(self._conns)
        return {n: self.status(n) for n in names}

    def tools(self) -> list[ToolInfo]:
        """The tools of every ready server, with the names offered to the model."""
        with self._lock:
            return [t for c in self._conns.values() if c.status.state == READY for t in c.status.tools]

    def openai_tools(self) -> list[dict]:
        return [t.openai() for t in self.tools()]

    def resolve(self, function: str) -> tuple[str, str] | None:
        """(server, tool) for a function name the model called; None when no ready server has it."""
        with self._lock:
            return self._functions.get(function)

    def timeout_of(self, server: str) -> float:
        with self._lock:
            conn = self._conns.get(server)
            return conn.config.timeout_s if conn else 60.0

    def call(self, function: str, arguments: dict, timeout: float | None = None) -> concurrent.futures.Future:
        """Call the tool the model named; the future's result is a ToolResult (never an exception): a tool
        error, a failed or dead server and a timeout are results of their own kind."""
        return asyncio.run_coroutine_threadsafe(self._call(function, arguments, timeout), self._loop)

    def close(self, timeout: float = 5.0) -> None:
        """Disconnect every server (stdio servers are ended) and stop the thread."""
        if not self._loop.is_running():
            return
        fut = asyncio.run_coroutine_threadsafe(self._apply([]), self._loop)
        with contextlib.suppress(Exception):
            fut.result(timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)

    # On the loop
    def _changed(self, name: str) -> None:
        self._rebuild_functions()
        if self.on_change is not None:
            try:
                self.on_change(name)
            except Exception:  # noqa: BLE001 - a listener's bug must not take the MCP thread down
                log.exception("MCP change listener failed")

    def _rebuild_functions(self) -> None:
        with self._lock:
            ready = [c for c in self._conns.values() if c.status.state == READY]
            counts: dict[str, int] = {}
            for c in ready:
                for t in c.status.tools:
                    counts[_sanitize(t.name)] = counts.get(_sanitize(t.name), 0) + 1
            functions = {}
            for c in ready:
                for t in c.status.tools:
                    base = _sanitize(t.name)
                    # Two servers with a tool of the same name: both get their server's name in front.
                    t.function = base if counts[base] == 1 else _sanitize(f"{c.config.name}__{t.name}")
                    functions[t.function] = (c.config.name, t.name)
            self._functions = functions

    async def _apply(self, servers: list[ServerConfig]) -> None:
        wanted = {s.name: s for s in servers if s.enabled and not s.check()}
        for name in list(self._conns):
            conn = self._conns[name]
            new = wanted.get(name)
            if new is None or _connection_key(new) != _connection_key(conn.config) or conn.status.state == ERROR:
                await self._drop(name)  # gone, changed, or failed (saving the settings tries it again)
            else:
                conn.config = new  # always-allow or the timeout changed: no reconnect needed
        for name, config in wanted.items():
            if name not in self._conns:
                self._start(config)

    async def _reconnect(self, name: str) -> None:
        conn = self._conns.get(name)
        if conn is not None:
            config = conn.config
            await self._drop(name)
            self._start(config)

    def _start(self, config: ServerConfig) -> None:
        conn = _Conn(config)
        conn.stop = asyncio.Event()
        conn.dead = asyncio.Event()
        with self._lock:
            self._conns[config.name] = conn
        conn.task = self._loop.create_task(self._run(conn))

    async def _drop(self, name: str) -> None:
        with self._lock:
            conn = self._conns.pop(name, None)
        if conn is None:
            return
        conn.stop.set()
        if conn.task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(conn.task), 10)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - it is going away either way
                conn.task.cancel()
        self._changed(name)

    def _set(self, conn: _Conn, state: str, error: str | None = None) -> None:
        with self._lock:
            conn.status.state = state
            if error is not None:
                conn.status.error = error
            if state != READY:
                conn.session = None
        self._changed(conn.config.name)

    async def _run(self, conn: _Conn) -> None:
        """Connect, list the tools, then hold the connection until told to stop or the server goes away."""
        cfg = conn.config
        self._set(conn, CONNECTING)
        try:
            try:
                from mcp import ClientSession  # the SDK loads only when a server is configured
            except ImportError:
                raise ImportError(f"The MCP SDK is not installed: {SDK_INSTALL} (setup.sh --gui installs it).") from None
            async with contextlib.AsyncExitStack() as stack:
                read, write = await self._open(stack, conn)
                session = await stack.enter_async_context(ClientSession(read, write))
                with _deadline(CONNECT_TIMEOUT_S, f"MCP server {cfg.name!r} did not finish its handshake within "
                                                  f"{CONNECT_TIMEOUT_S:.0f} s."):
                    init = await session.initialize()
                    listed = await session.list_tools()
                info = getattr(init, "server_info", None) or getattr(init, "serverInfo", None)
                tools = [ToolInfo(cfg.name, t.name, t.description or "",
                                  dict(getattr(t, "input_schema", None) or getattr(t, "inputSchema", None) or {}))
                         for t in listed.tools]
                with self._lock:
                    conn.session = session
                    conn.status.tools = tools
                    conn.status.server_info = f"{info.name} {info.version}".strip() if info else ""
                self._set(conn, READY, "")
                await self._hold(conn, session)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - said in the server's status
            if not conn.stop.is_set():
                self._set(conn, ERROR, self._why(conn, exc))
            return
        finally:
            self._fail_calls(conn, f"MCP server {cfg.name!r} went away during the call.")
            if conn.errlog is not None:
                conn.errlog.close()
        if conn.stop.is_set():
            self._set(conn, OFF)

    async def _open(self, stack: contextlib.AsyncExitStack, conn: _Conn):
        """The transport's streams, and a check that says whether the server is still there."""
        cfg = conn.config
        if cfg.url:
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client

            http = await stack.enter_async_context(create_mcp_http_client(headers=dict(cfg.headers)))
            return await stack.enter_async_context(streamable_http_client(cfg.url, http_client=http))
        from mcp.client.stdio import StdioServerParameters, stdio_client

        conn.errlog = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
        params = StdioServerParameters(command=cfg.command, args=list(cfg.args), env=dict(cfg.env) or None,
                                       cwd=cfg.cwd or None)
        return await stack.enter_async_context(stdio_client(params, errlog=conn.errlog))

    async def _hold(self, conn: _Conn, session) -> None:
        """Wait for stop. A server that died in between (a call met its closed connection, or it stopped
        answering pings while idle) ends the connection as an error."""
        name = conn.config.name
        while not conn.stop.is_set():
            stop, dead = asyncio.ensure_future(conn.stop.wait()), asyncio.ensure_future(conn.dead.wait())
            await asyncio.wait({stop, dead}, timeout=PING_INTERVAL_S, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            dead.cancel()
            if conn.stop.is_set():
                return
            if conn.dead.is_set():
                raise ConnectionError(f"MCP server {name!r} stopped: {conn.death}")
            if conn.calls:
                continue  # busy: a long call is no sign of death
            try:
                await asyncio.wait_for(session.send_ping(), PING_TIMEOUT_S)
            except asyncio.TimeoutError:
                raise ConnectionError(f"MCP server {name!r} stopped answering (no ping reply in "
                                      f"{PING_TIMEOUT_S:.0f} s).") from None
            except Exception as exc:  # noqa: BLE001 - said in the status
                raise ConnectionError(f"MCP server {name!r} stopped: {describe_error(exc)}") from None

    def _why(self, conn: _Conn, exc: BaseException) -> str:
        text = describe_error(exc)
        if conn.errlog is not None:
            with contextlib.suppress(OSError, ValueError):
                conn.errlog.flush()
                conn.errlog.seek(0)
                tail = conn.errlog.read()[-1500:].strip()
                if tail:
                    text += "\nIts last output:\n" + tail
        return text

    def _fail_calls(self, conn: _Conn, why: str) -> None:
        conn.failing = True  # the calls' CancelledError is then a failed call, not a cancelled caller
        for task in list(conn.calls):
            task.cancel(why)

    async def _call(self, function: str, arguments: dict, timeout: float | None) -> ToolResult:
        target = self.resolve(function)
        if target is None:
            return ToolResult(f"No enabled MCP server offers a tool named {function!r}.", True, "failed")
        server, tool = target
        conn = self._conns.get(server)
        session = conn.session if conn is not None else None
        if session is None:
            return ToolResult(f"MCP server {server!r} is not connected ({conn.status.state if conn else 'removed'}).",
                              True, "failed")
        limit = float(timeout or conn.config.timeout_s)
        task = asyncio.current_task()
        conn.calls.add(task)
        try:
            result = await asyncio.wait_for(session.call_tool(tool, arguments), limit)
        except asyncio.TimeoutError:
            return ToolResult(f"The tool {tool!r} on MCP server {server!r} did not answer within {limit:g} s "
                              f"(the server's \"timeout\" in mcp.json sets the limit).", True, "timeout")
        except asyncio.CancelledError:
            if conn.stop.is_set() or conn.status.state != READY or conn.failing:
                died = conn.status.error.splitlines()[0] if conn.status.error else "it went away"
                return ToolResult(f"MCP server {server!r} failed during the call: {died}", True, "failed")
            raise
        except BaseException as exc:  # noqa: BLE001 - the model and the user get the reason
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            why = describe_error(exc)
            if getattr(getattr(exc, "error", None), "code", None) == CONNECTION_CLOSED or "Connection closed" in why:
                conn.death = f"its connection closed during a call to {tool!r}"
                conn.dead.set()
                return ToolResult(f"MCP server {server!r} stopped during the call to {tool!r} (it exited or "
                                  f"its connection broke: {why}). The Tools page shows its last output.", True,
                                  "failed")
            return ToolResult(f"The tool {tool!r} on MCP server {server!r} failed: {why}", True, "failed")
        finally:
            conn.calls.discard(task)
        text, is_error = result_text(result)
        return ToolResult(text, is_error, "error" if is_error else "ok")


def _connection_key(cfg: ServerConfig) -> tuple:
    return (cfg.command, tuple(cfg.args), tuple(sorted(cfg.env.items())), cfg.cwd, cfg.url,
            tuple(sorted(cfg.headers.items())))


@contextlib.contextmanager
def _deadline(seconds: float, message: str):
    try:
        import anyio

        with anyio.fail_after(seconds):
            yield
    except TimeoutError:
        raise TimeoutError(message) from None

