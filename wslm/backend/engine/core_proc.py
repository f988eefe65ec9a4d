"""The engine core process: one per served generation model (engine/core_client.py MPClient starts it).

It builds the executor and the EngineCore, then loops: take the front end's messages (add, abort, compile,
shutdown), run a step while anything is unfinished, send the step's plain-data outputs back.

No core is ever left behind holding the model's memory when the server is gone (SIGKILL included), by three
means: the kernel kills it at once when its parent dies (prctl PR_SET_PDEATHSIG on Linux; the parent is the
thread that forked it, which is why core_client starts cores from a thread that lasts: the main thread or its
starter thread); a thread watches getppid() four times a second (where prctl is missing, or the parent died
before it was set); and the pipe to the server closing ends the loop (not alone enough: a core forked later
holds a copy of an earlier core's pipe end)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

from wslm.backend.engine.core import EngineCoreFailure, EngineCoreOutputs
from wslm.backend.errors import EngineDeadError, ErrorKind

logger = logging.getLogger("wslm.engine")

_STATS_INTERVAL_S = 0.05  # stats ride along with outputs at most this often while busy
_PARENT_CHECK_S = 0.25


def core_main(conn, parent_end, config, source, mc, device, parent_pid: int, tokenizer=None) -> None:
    if parent_end is not None:
        try:
            parent_end.close()  # forked: the parent's end of the pipe came along; only the parent may hold it
        except OSError:
            pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the server stops us cleanly
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked child inherits the server's handler otherwise
    kill_me_with_parent()
    _watch_parent(parent_pid)
    _name_process()
    if tokenizer is not None:
        from wslm.backend.structured.compiler import set_rebuild_tokenizer

        set_rebuild_tokenizer(tokenizer, mc.vocab_size, sorted(mc.eos_token_ids))
    from wslm.backend.engine.core_setup import build_core

    try:
        core, info = build_core(config, source, mc, device, in_core_process=True)
    except BaseException as exc:  # noqa: BLE001 - the parent raises it as its own load failure
        logger.exception("Loading the model in the engine core process failed")
        conn.send(("error", type(exc).__name__, str(exc) or type(exc).__name__))
        conn.close()
        os._exit(1)
    conn.send(("ready", info, core.get_stats()))
    try:
        _loop(conn, core)
    except EngineDeadError as exc:
        _send_quietly(conn, ("dead", str(exc)))
        os._exit(1)
    except (EOFError, OSError, BrokenPipeError):
        pass  # the parent is gone
    except BaseException as exc:  # noqa: BLE001 - a bug in the loop: the server is told why, then we go
        logger.exception("The engine core loop failed")
        _send_quietly(conn, ("dead", f"{type(exc).__name__}: {exc}"))
        os._exit(1)
    finally:
        core.executor.shutdown()
    os._exit(0)


def _loop(conn, core) -> None:
    last_stats = 0.0
    busy = False
    while True:
        if not busy:
            conn.poll(None)
        aborted = False
        while conn.poll(0):
            msg = conn.recv()
            kind = msg[0]
            if kind == "add":
                req = msg[1]
                try:
                    core.add_request(req)
                except Exception as exc:  # noqa: BLE001 - the request's failure, not the core's
                    failed = EngineCoreOutputs(failed=[EngineCoreFailure(req.request_id, ErrorKind.ENGINE, str(exc))])
                    conn.send(("out", failed, None))
            elif kind == "abort":
                core.abort_request(msg[1], msg[2])
                aborted = True
            elif kind == "compile":
                core.executor.start_background_compile()
            elif kind == "shutdown":
                return
        stepped = core.has_unfinished_requests()
        if stepped:
            out = core.step()
            now = time.monotonic()
            stats = None
            if now - last_stats >= _STATS_INTERVAL_S or not core.has_unfinished_requests():
                stats, last_stats = core.get_stats(), now  # and always the idle figures at the end
            if out.tokens or out.failed or stats is not None:
                conn.send(("out", out, stats))
        was_busy, busy = busy, core.has_unfinished_requests()
        if not busy and not stepped and (was_busy or aborted):  # no step carried the idle figures
            conn.send(("stats", core.get_stats()))


def _send_quietly(conn, msg: tuple) -> None:
    try:
        conn.send(msg)
    except (OSError, BrokenPipeError, EOFError):
        pass


_PR_SET_PDEATHSIG = 1


def kill_me_with_parent() -> bool:
    """Ask the kernel for SIGKILL when the parent (thread) dies: PR_SET_PDEATHSIG, Linux only. False where
    it is not available (the getppid watch still ends us)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _name_process() -> None:
    """`wslm:MODEL` in ps/top (the last part of its path or repo id; the kernel keeps 15 bytes), so a user can tell which model a core serves."""
    import multiprocessing

    name = os.path.basename(multiprocessing.current_process().name.removeprefix("wslm-core").strip().rstrip("/"))
    try:
        with open("/proc/self/comm", "w", encoding="utf-8") as f:
            f.write(f"wslm:{name}".encode()[:15].decode(errors="ignore"))
    except OSError:
        pass


def _watch_parent(parent_pid: int) -> None:
    if os.getppid() != parent_pid:
        os._exit(0)  # the server died before the death signal was asked for

    def watch() -> None:
        while True:
            time.sleep(_PARENT_CHECK_S)
            if os.getppid() != parent_pid:
                os._exit(0)  # the server is gone (even SIGKILL): the model's memory goes with us

    threading.Thread(target=watch, name="wslm-core-parent-watch", daemon=True).start()
