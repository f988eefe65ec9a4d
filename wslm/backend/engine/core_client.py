"""EngineCoreClient: how the front end (frontend/llm_engine.py) reaches the EngineCore, as vLLM v1's
core_client.py. Every message is plain data: EngineRequests in (prompt ids, params, a compiled grammar, the
`extras` other features add), EngineCoreOutputs back (request ids, token ids, raw logprobs, finish reasons).

- InprocClient: the core in the caller's own process and thread (LLM, tests, `WSLM_CORE_PROCESS=0`).
- MPClient: the core and its executor in a child process (engine/core_proc.py), messages pickled over a
  multiprocessing pipe. The server runs each generation model this way: HTTP, SSE and detokenizing stay in
  the server's process, and a crash or out-of-memory kill of a model's core is that model's alone (its
  requests fail with EngineDeadError, the model pool loads it again).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import sys
import threading
import time
import weakref

from wslm.backend.engine.core import EngineCore, EngineCoreOutputs, EngineRequest
from wslm.backend.engine.core_death import death_message, exit_text, oom_kill_count
from wslm.backend.engine.core_setup import CoreInfo, model_ran_here
from wslm.backend.errors import EngineDeadError

logger = logging.getLogger("wslm.engine")

_POLL_S = 0.02  # how long get_output waits for the core before the caller looks at its inbox again
_STOP_GRACE_S = 5.0  # a core process asked to stop gets this long before SIGKILL


def safe_start_method(asked: str) -> str:
    """fork, unless this process already ran a model (core_setup.note_model_in_process) or holds a CUDA
    context (--model-pool on a GPU measures the card's free memory here): then spawn."""
    if asked == "fork" and model_ran_here():
        logger.info("Starting the engine core process by spawn, not fork: this process already ran a model, and "
                    "OpenMP's threads do not survive a fork (a few seconds more to import torch again)")
        return "spawn"
    torch = sys.modules.get("torch")
    if asked == "fork" and torch is not None and torch.cuda.is_initialized():
        logger.info("Starting the engine core process by spawn, not fork: this process holds a CUDA context, "
                    "which a forked child cannot use")
        return "spawn"
    return asked


class EngineCoreClient:
    """The front end's handle on a core. get_output() runs (in-process) or collects (multiprocess) steps."""

    def add_request(self, req: EngineRequest) -> None:
        raise NotImplementedError

    def abort(self, request_id: str, index: int | None = None) -> None:
        """Finish a request (only its completion `index` when given: a stop string ended it)."""
        raise NotImplementedError

    def get_output(self) -> EngineCoreOutputs:
        raise NotImplementedError

    def get_stats(self) -> dict:
        raise NotImplementedError

    def check_health(self) -> None:
        """Raises EngineDeadError when the core (or its workers) is gone."""

    def start_background_compile(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


class InprocClient(EngineCoreClient):
    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def add_request(self, req: EngineRequest) -> None:
        self.core.add_request(req)

    def abort(self, request_id: str, index: int | None = None) -> None:
        self.core.abort_request(request_id, index)

    def get_output(self) -> EngineCoreOutputs:
        return self.core.step()

    def get_stats(self) -> dict:
        return self.core.get_stats()

    def check_health(self) -> None:
        self.core.executor.check_health()

    def start_background_compile(self) -> None:
        self.core.executor.start_background_compile()

    def shutdown(self) -> None:
        self.core.executor.shutdown()


class MPClient(EngineCoreClient):
    """The core in a child process; see the module's doc. Start method: envs.WSLM_CORE_START_METHOD (fork by
    default: the child starts in milliseconds with everything imported; spawn re-imports torch, ~seconds)."""

    def __init__(self, config, source, mc, device, tokenizer=None, start_method: str = "fork", name: str = "") -> None:
        from wslm.backend.engine.core_proc import core_main

        start_method = safe_start_method(start_method)
        ctx = mp.get_context(start_method)
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=core_main, name=f"wslm-core {name}".strip(),
                                args=(child_conn, self.conn if start_method == "fork" else None, config, source, mc,
                                      device, os.getpid(), tokenizer), daemon=False)
        started = time.monotonic()
        self._oom_at_start = oom_kill_count()
        start_in_lasting_thread(self.proc)
        child_conn.close()  # the child's end lives in the child only: its death closes the pipe here
        self.dead: str | None = None
        self.stats: dict = {}
        self._buffered = EngineCoreOutputs()  # read by get_stats, handed out by the next get_output
        self._finalizer = weakref.finalize(self, _stop_process, self.proc, self.conn)
        try:
            kind, *payload = self._recv_startup()
        except BaseException:
            self._finalizer()
            raise
        if kind == "error":
            self._finalizer()
            type_name, message = payload
            raise startup_error(type_name, message)
        self.info: CoreInfo = payload[0]
        self.stats = payload[1]
        logger.info("Engine core process %d ready (%s start, %.1f s with the model load)", self.proc.pid,
                    start_method, time.monotonic() - started)

    def _recv_startup(self) -> tuple:
        while not self.conn.poll(0.5):
            if not self.proc.is_alive():
                raise RuntimeError(f"The engine core process exited while loading the model ({_exit_text(self.proc)}); "
                                   "its log (stderr) has the details.")
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            self.proc.join(2)
            raise RuntimeError(f"The engine core process exited while loading the model ({_exit_text(self.proc)}); "
                               "its log (stderr) has the details.") from None

    def _send(self, msg: tuple) -> None:
        if self.dead:
            raise EngineDeadError(self.dead)
        try:
            self.conn.send(msg)
        except (BrokenPipeError, OSError, EOFError):
            self._die()

    def _die(self, reported: str | None = None) -> None:
        self.proc.join(1)
        self.dead = death_message(self.proc.exitcode, self._oom_at_start, reported)
        self.stats = {**self.stats, "num_requests_running": 0, "num_requests_waiting": 0}  # /metrics: none run
        logger.error(self.dead)
        self._finalizer()
        raise EngineDeadError(self.dead)

    def add_request(self, req: EngineRequest) -> None:
        self._send(("add", req))

    def abort(self, request_id: str, index: int | None = None) -> None:
        self._send(("abort", request_id, index))

    def get_output(self) -> EngineCoreOutputs:
        """The outputs of the core's steps since the last call (waits up to _POLL_S for one)."""
        merged, self._buffered = self._buffered, EngineCoreOutputs()
        self._drain(0 if merged.tokens or merged.failed else _POLL_S, merged)
        return merged

    def _drain(self, timeout: float, into: EngineCoreOutputs) -> None:
        if self.dead:
            raise EngineDeadError(self.dead)
        try:
            if not self.conn.poll(timeout):
                if timeout and not self.proc.is_alive():
                    self._die()
                return
            while True:
                kind, *payload = self.conn.recv()
                if kind == "out":
                    outs, stats = payload
                    into.tokens.extend(outs.tokens)
                    into.failed.extend(outs.failed)
                    if stats is not None:
                        self.stats = stats
                elif kind == "stats":
                    self.stats = payload[0]
                elif kind == "dead":
                    self._die(payload[0])
                if not self.conn.poll(0):
                    return
        except (EOFError, OSError):
            self._die()

    @property
    def busy(self) -> bool:
        """The core has requests by its latest figures (after an abort, until it reports itself idle)."""
        if self.dead:
            return False
        return bool(self.stats.get("num_requests_running") or self.stats.get("num_requests_waiting"))

    def get_stats(self) -> dict:
        """The core's latest figures (they ride along with its outputs; read without waiting)."""
        try:
            self._drain(0, self._buffered)
        except EngineDeadError:
            pass  # reported by the next get_output
        return self.stats

    def check_health(self) -> None:
        if self.dead:
            raise EngineDeadError(self.dead)
        if not self.proc.is_alive():
            self._die()

    def start_background_compile(self) -> None:
        self._send(("compile",))

    def shutdown(self) -> None:
        self._finalizer()


def startup_error(type_name: str, message: str) -> Exception:
    """The child's load error as an exception here: a known type as itself, any other as a RuntimeError
    subclass that keeps the child's type name (SafetensorError, ...), so messages name the real cause."""
    known = _STARTUP_ERRORS.get(type_name)
    if known is not None:
        return known(message)
    name = type_name if type_name.isidentifier() else "RuntimeError"
    return type(name, (RuntimeError,), {"__module__": __name__})(message)


_STARTUP_ERRORS = {"ValueError": ValueError, "FileNotFoundError": FileNotFoundError, "MemoryError": MemoryError,
                   "OutOfMemoryError": MemoryError}


def _exit_text(proc) -> str:
    return exit_text(proc.exitcode)


class _Starter:
    """One thread that lives as long as the process and starts the core processes of the other threads.
    A core asks the kernel to kill it when its parent dies (prctl PR_SET_PDEATHSIG, core_proc.py), and the
    kernel reads "parent" as the thread that forked it: a core started by a model pool's worker thread or an
    engine loop thread (a restart) would be killed when that thread ends, before the server stops it cleanly."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._jobs: list[tuple[object, list]] = []
        self._thread: threading.Thread | None = None

    def start(self, proc) -> None:
        done: list = []
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="wslm-core-starter", daemon=True)
                self._thread.start()
            self._jobs.append((proc, done))
            self._cond.notify_all()
            while not done:
                self._cond.wait()
        if isinstance(done[0], BaseException):
            raise done[0]

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs:
                    self._cond.wait()
                proc, done = self._jobs.pop(0)
            try:
                proc.start()
                result: object = None
            except BaseException as exc:  # noqa: BLE001 - raised in the asking thread
                result = exc
            with self._cond:
                done.append(result)
                self._cond.notify_all()


_starter = _Starter()
os.register_at_fork(after_in_child=_starter.__init__)  # a forked child has no starter thread of its own


def start_in_lasting_thread(proc) -> None:
    """proc.start() from a thread that lives until the process exits (the main thread, or _Starter's)."""
    if threading.current_thread() is threading.main_thread():
        proc.start()
    else:
        _starter.start(proc)


def _stop_process(proc, conn) -> None:
    """Ask the core process to stop, then make sure it did (idempotent; also runs at interpreter exit)."""
    if proc.pid is None:
        return
    if proc.is_alive():
        try:
            conn.send(("shutdown",))
        except (BrokenPipeError, OSError, EOFError):
            pass
        proc.join(_STOP_GRACE_S)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    else:
        proc.join(0)
    try:
        conn.close()
    except OSError:
        pass
