"""AsyncEngine: the one thread that owns the (not thread-safe) LLMEngine, and RequestGroup, what a handler
holds while its requests run.

The HTTP side never touches the engine. It posts add/abort commands into an inbox; the engine thread drains
the inbox between steps (so requests join the running batch at any step), runs engine.step(), and hands each
step's deltas back to the event loop in one call_soon_threadsafe batch, into per-request asyncio queues.
When nothing is running the thread sleeps on a condition variable: no busy spin."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from wslm.backend.errors import EngineDeadError, ErrorKind
from wslm.backend.frontend.core_restart import RestartFailed
from wslm.backend.frontend.metrics import ServerMetrics
from wslm.backend.outputs import RequestOutput
from wslm.backend.sampling_params import SamplingParams

log = logging.getLogger("wslm.server.engine")

_STATS_INTERVAL_S = 0.05  # how often get_stats() is sampled while busy
_IDLE_CHECK_S = 1.0  # with a restarter: how often an idle loop checks that its core process lives


@dataclass(slots=True)
class Aborted:
    """Queued to a request that was aborted by the server (shutdown), not by its own handler."""

    reason: str = "abort"


class EngineFailure(RuntimeError):
    """Queued to a request when the engine loop itself broke while running it (or raised by a handler
    for a request the engine failed); kind: why, typed (the server maps it to a status code)."""

    def __init__(self, message: str, kind: ErrorKind = ErrorKind.ENGINE) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(slots=True)
class _Tracked:
    queue: asyncio.Queue
    tag: Any
    arrival: float
    first_token: float | None = None
    last_token: float | None = None


@dataclass(slots=True)
class _Add:
    request: Any  # what engine.process() made: an EngineRequest (the encoder engine's own for BERT models)
    queue: asyncio.Queue
    tag: Any
    future: asyncio.Future


@dataclass(slots=True)
class _Abort:
    request_ids: Sequence[str]


class _AbortAll:
    pass


class _Stop:
    pass


class AsyncEngine:
    def __init__(self, engine: Any, metrics: ServerMetrics | None = None, log_requests: bool = False) -> None:
        self.engine = engine
        self.metrics = metrics
        self.log_requests = log_requests  # --enable-log-requests: one line per request queued
        self._cond = threading.Condition()
        self._inbox: list = []
        self._tracked: dict[str, _Tracked] = {}  # engine thread only
        self._busy = False  # engine thread only
        self._deliveries: list = []  # this iteration's, delivered even if the loop dies mid-iteration
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._last_stats = 0.0
        self.draining = False  # set on SIGTERM/SIGINT: new requests are refused
        self.dead: str | None = None  # set if the loop thread ever exits by accident
        self.on_death: Any = None  # called (engine thread) with the cause when the loop dies
        # frontend/core_restart.CoreRestarter: a dead core process fails its requests and the next request
        # starts a new one, the loop goes on (the default model); None: a dead core ends the loop.
        self.restarter: Any = None

    # ---- lifecycle (event-loop thread) ----
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._snapshot_stats(force=True)
        self._thread = threading.Thread(target=self._run_guarded, name="wslm-engine-loop", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._post(_Stop())
        if self._thread is not None:
            self._thread.join(timeout)
        shutdown = getattr(self.engine, "shutdown", None)
        if shutdown is not None:  # tensor-parallel workers: stopped with the server, never orphaned
            try:
                shutdown()
            except Exception:  # noqa: BLE001
                log.exception("Stopping the engine's workers failed")

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.dead is None

    def begin_drain(self, grace_s: float) -> None:
        """Stop taking requests; give the running ones grace_s seconds, then abort them (their streams end
        with a finish chunk). Safe to call from a signal handler."""
        if self.draining:
            return
        self.draining = True
        timer = threading.Timer(max(grace_s, 0.0), self.abort_all)
        timer.daemon = True
        timer.start()

    # ---- commands (any thread) ----
    async def submit(self, request_id: str, prompt: Any, params: SamplingParams, queue: asyncio.Queue, tag: Any,
                     **names: Any) -> Any:
        """Make the request ready (engine.process: tokenize, truncate, validate, grammar; once, in a worker
        thread), then queue it; returns the processed request once the engine took it. Raises the
        RequestError (a ValueError naming the field: names' what= and structured_param=) when it cannot be
        served; nothing is queued then."""
        assert self._loop is not None, "AsyncEngine.start() was not called"
        arrival = time.monotonic()
        request = await asyncio.to_thread(self.engine.process, request_id, prompt, params, arrival, **names)
        if self.log_requests:
            log.info("Received request %s: %d prompt tokens, params: %s", request_id,
                     len(getattr(request, "prompt_token_ids", None) or getattr(request, "ids", [])), params)
        future = self._loop.create_future()
        self._post(_Add(request, queue, tag, future))
        await future
        return request

    async def apply_chat_template(self, messages: list[dict], **kwargs: Any) -> list[int]:
        """The engine's chat rendering (LLMEngine.apply_chat_template, the same as LLM.chat), run in a worker
        thread: Jinja and tokenizing a long chat take milliseconds the event loop must not block on. It only
        reads the tokenizer and the template, never the engine's scheduling state."""
        ids = await asyncio.to_thread(self.engine.apply_chat_template, messages, **kwargs)
        return ids if isinstance(ids, list) else list(ids)  # a PromptIds (a list carrying images) as it is

    async def encode(self, text: str, add_special_tokens: bool = True, max_length: int | None = None) -> list[int]:
        """Tokenize a prompt off the event loop (a long prompt takes a while); max_length: cut to that many
        tokens the tokenizer's way (its truncation side, special tokens kept)."""
        tokenizer = self.engine.tokenizer
        if max_length is None:
            return list(await asyncio.to_thread(tokenizer.encode, text, add_special_tokens=add_special_tokens))
        enc = await asyncio.to_thread(tokenizer, text, add_special_tokens=add_special_tokens, truncation=True,
                                      max_length=max_length)
        return list(enc["input_ids"])

    def abort(self, request_ids: Sequence[str]) -> None:
        if request_ids:
            self._post(_Abort(list(request_ids)))

    def abort_all(self) -> None:
        self._post(_AbortAll())

    def _post(self, command: object) -> None:
        with self._cond:
            self._inbox.append(command)
            self._cond.notify()

    # ---- the engine thread ----
    def _run_guarded(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 - must be reported, not lost with the thread
            self.dead = f"{type(exc).__name__}: {exc}"
            log.exception("The engine loop stopped")
            if self.on_death is not None:  # the server exits non-zero rather than live on as a zombie
                try:
                    self.on_death(self.dead)
                except Exception:  # noqa: BLE001
                    log.exception("on_death failed")
            self._deliver(self._deliveries)  # e.g. "accepted" for a request added in the fatal iteration
            kind = ErrorKind.ENGINE_DEAD if isinstance(exc, EngineDeadError) else ErrorKind.ENGINE
            self._fail_all(f"The engine loop stopped ({self.dead}).", kind)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._inbox and not self._busy:
                    if not self._cond.wait(_IDLE_CHECK_S if self.restarter is not None else None):
                        break  # idle: look at the core below
                commands, self._inbox = self._inbox, []
            deliveries: list = []
            self._deliveries = deliveries
            if not commands and not self._busy and self.restarter is not None:
                self._check_core(deliveries)
            for command in commands:
                if isinstance(command, _Stop):
                    self._abort_tracked(deliveries)
                    self._deliver(deliveries)
                    return
                try:
                    self._handle(command, deliveries)
                except EngineDeadError as exc:  # an abort found the core gone
                    if self.restarter is None:
                        raise
                    self._core_died(str(exc), deliveries)
            if self.engine.has_unfinished_requests():
                self._step(deliveries)
            self._busy = self.engine.has_unfinished_requests()
            self._snapshot_stats(force=not self._busy)
            self._deliver(deliveries)

    def _handle(self, command: object, deliveries: list) -> None:
        if isinstance(command, _Add):
            if command.future.cancelled():
                return  # the client went away before we got to it
            request = command.request
            try:
                self._add(request, deliveries)
            except EngineDeadError as exc:  # the core is gone: this request fails as the running ones do
                deliveries.append((command.future, EngineFailure(str(exc), ErrorKind.ENGINE_DEAD)))
                raise
            except RestartFailed as exc:  # its core died earlier and could not be started again
                deliveries.append((command.future, EngineFailure(str(exc), exc.kind)))
                return
            except Exception as exc:  # noqa: BLE001 - ValueError is the user's; anything else is reported too
                deliveries.append((command.future, exc))
                return
            arrival = getattr(request, "arrival_time", None) or getattr(request, "arrival", time.monotonic())
            self._tracked[request.request_id] = _Tracked(command.queue, command.tag, arrival)
            deliveries.append((command.future, None))
        elif isinstance(command, _Abort):
            ids = [rid for rid in command.request_ids if rid in self._tracked]
            for rid in ids:
                del self._tracked[rid]
            if ids:
                self.engine.abort_request(ids)
                if self.metrics is not None:
                    for _ in ids:
                        self.metrics.observe_finished_reason("abort")
        elif isinstance(command, _AbortAll):
            self._abort_tracked(deliveries)

    def _add(self, request: Any, deliveries: list) -> None:
        if self.restarter is None:
            self.engine.add_engine_request(request)
            return
        self._check_core(deliveries)  # a core that died unseen: its requests are told, a new one starts
        self.restarter.ensure_up()
        try:
            self.engine.add_engine_request(request)
        except EngineDeadError as exc:  # it died this very moment: once more, on a new core
            self._core_died(str(exc), deliveries)
            self.restarter.ensure_up()
            self.engine.add_engine_request(request)

    def _check_core(self, deliveries: list) -> None:
        try:
            self.restarter.check()
        except EngineDeadError as exc:
            self._core_died(str(exc), deliveries)

    def _core_died(self, why: str, deliveries: list) -> None:
        """The core process died (a restarter is set): its requests fail now (503), the loop goes on."""
        for tracked in self._tracked.values():
            deliveries.append((tracked.queue, (tracked.tag, EngineFailure(why, ErrorKind.ENGINE_DEAD))))
        self._tracked.clear()
        self.restarter.died(why)

    def _abort_tracked(self, deliveries: list) -> None:
        ids = list(self._tracked)
        if not ids:
            return
        try:
            self.engine.abort_request(ids)
        except Exception:  # noqa: BLE001
            log.exception("abort_request failed")
        for rid in ids:
            tracked = self._tracked.pop(rid)
            deliveries.append((tracked.queue, (tracked.tag, Aborted())))
            if self.metrics is not None:
                self.metrics.observe_finished_reason("abort")

    def _step(self, deliveries: list) -> None:
        try:
            outputs: list[RequestOutput] = self.engine.step()
        except EngineDeadError as exc:
            if self.restarter is None:
                raise  # the model's workers are gone: the loop ends, /health turns 503
            self._core_died(str(exc), deliveries)
            return
        except Exception as exc:  # noqa: BLE001 - fail this step's requests, keep serving the next ones
            log.exception("engine.step() failed; failing the requests in flight")
            message = f"The engine failed while running this request ({type(exc).__name__}: {exc})."
            for tracked in self._tracked.values():
                deliveries.append((tracked.queue, (tracked.tag, EngineFailure(message))))
            ids = list(self._tracked)
            self._tracked.clear()
            try:
                self.engine.abort_request(ids)
            except Exception:  # noqa: BLE001
                log.exception("abort_request failed after a failed step")
            return
        now = time.monotonic()
        metrics = self.metrics
        for out in outputs:
            tracked = self._tracked.get(out.request_id)
            if tracked is None:
                continue  # aborted by its handler meanwhile
            generated = isinstance(out, RequestOutput)  # else a PoolingRequestOutput: one answer, no tokens
            if metrics is not None and generated and any(c.token_ids for c in out.outputs):
                if tracked.first_token is None:
                    tracked.first_token = now
                    metrics.observe_first_token(now - tracked.arrival)
                else:
                    metrics.observe_tokens(now - (tracked.last_token or now), 1)
                tracked.last_token = now
            deliveries.append((tracked.queue, (tracked.tag, out)))
            if out.finished:
                del self._tracked[out.request_id]
                if metrics is not None:
                    reason = out.outputs[-1].finish_reason if generated and out.outputs else None
                    metrics.observe_finished(now - tracked.arrival, [reason or "stop"])

    def _snapshot_stats(self, force: bool) -> None:
        if self.metrics is None:
            return
        now = time.monotonic()
        if not force and now - self._last_stats < _STATS_INTERVAL_S:
            return
        self._last_stats = now
        try:
            self.metrics.set_engine_stats(dict(self.engine.get_stats()))
        except Exception:  # noqa: BLE001 - metrics must never break serving
            log.exception("engine.get_stats() failed")

    def _fail_all(self, message: str, kind: ErrorKind = ErrorKind.ENGINE) -> None:
        deliveries = [(t.queue, (t.tag, EngineFailure(message, kind))) for t in self._tracked.values()]
        self._tracked.clear()
        self._deliver(deliveries)

    def _deliver(self, deliveries: list) -> None:
        if deliveries and self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(_deliver_on_loop, deliveries)
            except RuntimeError:
                pass  # the loop closed under us at shutdown


def _deliver_on_loop(deliveries: list) -> None:
    for target, value in deliveries:
        if isinstance(target, asyncio.Future):
            if not target.done():
                if value is None:
                    target.set_result(None)
                else:
                    target.set_exception(value)
        else:
            target.put_nowait(value)


class RequestGroup:
    """The engine requests behind one HTTP request (one per prompt), sharing one queue of (tag, item)
    pairs where item is a RequestOutput delta, an Aborted marker or an EngineFailure."""

    def __init__(self, engine: AsyncEngine, base_id: str) -> None:
        self.engine = engine
        self.base_id = base_id
        self.queue: asyncio.Queue = asyncio.Queue()
        self.request_ids: list[str] = []
        self.unfinished: set[str] = set()

    async def start(self, prompts: Sequence[Any], params: SamplingParams, **names: Any) -> list[list[int]]:
        """Submit one request per prompt (tag = its index) and wait until the engine accepted all of them;
        re-raises the engine's ValueError (after aborting the others) if it refused one. Returns each
        prompt's token ids as the engine runs them (tokenized, truncated). names: see AsyncEngine.submit."""
        submits = []
        for i, prompt in enumerate(prompts):
            rid = f"{self.base_id}-{i}"
            self.request_ids.append(rid)
            self.unfinished.add(rid)
            submits.append(self.engine.submit(rid, prompt, params, self.queue, i, **names))
        try:
            results = await asyncio.gather(*submits, return_exceptions=True)
        except BaseException:
            self.abort()
            raise
        for result in results:
            if isinstance(result, BaseException):
                self.abort()
                raise result
        return [list(getattr(r, "prompt_token_ids", None) or getattr(r, "ids", [])) for r in results]

    async def next_items(self) -> list[tuple[int, Any]]:
        """Wait for the next item, then take whatever else is already queued (coalesced under load)."""
        items = [await self.queue.get()]
        while not self.queue.empty():
            items.append(self.queue.get_nowait())
        for tag, item in items:
            if not isinstance(item, RequestOutput) or item.finished:
                self.unfinished.discard(self.request_ids[tag])
        return items

    @property
    def done(self) -> bool:
        return not self.unfinished

    def abort(self) -> None:
        """Abort what is still running (client gone, or an error); frees its KV blocks."""
        if self.unfinished:
            self.engine.abort(sorted(self.unfinished))
            self.unfinished.clear()
