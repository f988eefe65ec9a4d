"""The engine core process: one per served generation model (engine/core_client.py MPClient starts it).

It builds the executor and the EngineCore, then loops: take the front end's messages (add, abort, compile,
shutdown), run a step while anything is unfinished, send the step's plain-data outputs back. It watches its
parent: when the server process is gone (SIGKILL included) it exits within a quarter second, so no core is
ever left behind holding the model's memory. A parent-death signal (prctl PR_SET_PDEATHSIG) is not used: it
follows the thread that started the child, and the model pool loads models in worker threads."""

from __future__ import annotations

import logging
import os
import signal
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
    _watch_parent(parent_pid)
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


def _watch_parent(parent_pid: int) -> None:
    def watch() -> None:
        while True:
            time.sleep(_PARENT_CHECK_S)
            if os.getppid() != parent_pid:
                os._exit(0)  # the server is gone (even SIGKILL): the model's memory goes with us

    threading.Thread(target=watch, name="wslm-core-parent-watch", daemon=True).start()
