"""The default model's engine core started again after its process died (kill -9, the kernel's out-of-memory
killer, a crash in native code), so that `wslm serve MODEL` goes on serving as a pooled model does, instead of
exiting:

- the requests the core was running fail at once (HTTP 503, code engine_dead, the cause and the fix named:
  engine/core_death.py); the other models go on;
- the next request starts a new core process (same model, tokenizer and context length; the GPU share is
  measured anew when the launcher passes config_for) and runs on it; a failed start answers that request
  503 with the cause, and the next one tries again;
- each death and restart is logged and counted (/metrics: wslm:engine_core_deaths_total and
  wslm:engine_core_restarts_total).

Everything here runs on the AsyncEngine's thread, the one that owns the LLMEngine, so a restart needs no
locking against steps. With --model-pool the restart takes the pool's load lock, as a pool load does: loads
run one at a time, each sized after the last."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from wslm import envs
from wslm.backend.engine.core_death import OOM_FIX
from wslm.backend.errors import ErrorKind

log = logging.getLogger("wslm.server.engine")


def restartable(engine: Any) -> bool:
    """The engine's core runs in a process of its own that can be started again (LLMEngine with MPClient)."""
    from wslm.backend.engine.core_client import MPClient

    return isinstance(getattr(engine, "client", None), MPClient) and hasattr(engine, "restart_core")


def start_new_core(engine: Any, config: Any) -> Any:
    """A new core process for an LLMEngine whose core died: the same model, with the context length pinned
    to the one its requests were checked against (a KV pool that no longer holds it fails the start, naming
    the flag, rather than quietly serving a shorter context)."""
    from wslm.backend.engine.core_client import MPClient

    engine.client.shutdown()  # reaps the dead process, closes its pipe
    mc = engine.model_config
    pinned = dataclasses.replace(config, max_model_len=mc.max_model_len)
    client = MPClient(pinned, engine.source, mc, engine.device, tokenizer=engine.tokenizer,
                      start_method=envs.WSLM_CORE_START_METHOD, name=engine.model_name)
    if client.info.num_blocks != engine.limits.num_kv_blocks:  # the pool a request's length is checked against
        engine.limits = dataclasses.replace(engine.limits, num_kv_blocks=client.info.num_blocks)
    return client


class RestartFailed(RuntimeError):
    def __init__(self, message: str, kind: ErrorKind) -> None:
        super().__init__(message)
        self.kind = kind


class CoreRestarter:
    """What AsyncEngine.restarter holds for a model whose core restarts in place (see the module's doc)."""

    def __init__(self, engine: Any, name: str, metrics: Any = None, config_for: Callable[[], Any] | None = None,
                 lock: Callable[[], tuple[asyncio.Lock, asyncio.AbstractEventLoop] | None] | None = None) -> None:
        self.engine = engine
        self.name = name
        self.metrics = metrics
        self.config_for = config_for  # the engine flags for a new core (default: the first one's)
        self.lock = lock  # the model pool's load lock and its loop, when there is a pool
        self.down: str | None = None  # why the core is gone, until a new one runs
        self.deaths = 0
        self.restarts = 0

    def check(self) -> None:
        """Raises EngineDeadError when the running core has died unseen (checked while idle)."""
        if self.down is None:
            self.engine.check_health()

    def died(self, why: str) -> None:
        self.down = why
        self.deaths += 1
        self.engine.forget_requests()
        if self.metrics is not None:
            self.metrics.core_deaths += 1
        log.error("The engine core of the model %r stopped (%s): its requests failed with HTTP 503, the server goes "
                  "on and the next request starts the core again.", self.name, _cause(why))

    def ensure_up(self) -> None:
        """Start a new core if the last one died; raises RestartFailed (the request's answer) if it cannot."""
        if self.down is None:
            return
        log.info("Starting the engine core of the model %r again (it stopped: %s)", self.name, _cause(self.down))
        started = time.monotonic()
        try:
            with _held(self.lock() if self.lock is not None else None):
                config = self.config_for() if self.config_for is not None else None
                self.engine.restart_core(config)
        except Exception as exc:  # noqa: BLE001 - the request's answer; the next request tries again
            oom = isinstance(exc, MemoryError) or "OutOfMemory" in type(exc).__name__
            log.error("Starting the engine core of the model %r again failed: %s: %s", self.name,
                      type(exc).__name__, exc)
            message = (f"The model's engine core process stopped earlier ({_cause(self.down)}), and starting it "
                       f"again failed: {type(exc).__name__}: {str(exc).rstrip('. ')}. "
                       + (OOM_FIX + " " if oom else "") + "The next request tries again.")
            raise RestartFailed(message, ErrorKind.OUT_OF_MEMORY if oom else ErrorKind.ENGINE_DEAD) from exc
        self.down = None
        self.restarts += 1
        if self.metrics is not None:
            self.metrics.core_restarts += 1
        log.info("The engine core of the model %r runs again (restart %d, %.1f s).", self.name, self.restarts,
                 time.monotonic() - started)


def _cause(why: str) -> str:
    """The cause inside a death message (core_death.death_message), else the message itself."""
    head = "The model's engine core process stopped ("
    end = why.rfind("); its requests failed")
    return why[len(head):end] if why.startswith(head) and end > 0 else why


@contextlib.contextmanager
def _held(lock_and_loop: tuple[asyncio.Lock, asyncio.AbstractEventLoop] | None) -> Iterator[None]:
    """Hold an asyncio lock from a thread other than its loop's (the pool's load lock, from the engine thread)."""
    if lock_and_loop is None:
        yield
        return
    lock, loop = lock_and_loop
    future = asyncio.run_coroutine_threadsafe(lock.acquire(), loop)
    while True:
        try:
            future.result(timeout=1.0)
            break
        except concurrent.futures.TimeoutError:
            if loop.is_closed() or not loop.is_running():  # shutting down: load without it
                future.cancel()
                yield
                return
    try:
        yield
    finally:
        loop.call_soon_threadsafe(lock.release)
