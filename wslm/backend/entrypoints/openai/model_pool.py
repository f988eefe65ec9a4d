"""Several models behind one port, loaded when a request names them (`wslm serve --model-pool ...`), as LM
Studio's just-in-time loading and Ollama's `keep_alive` do.

The model of `--model` is loaded at start, stays loaded and is the default (a request naming no model, or
one this server does not serve, goes to it: its handlers answer as without a pool, 404s included). Every
other servable model has a PoolModel: a request naming it waits for its load (concurrent requests share
one load), then runs on that model's own ServerState (its own engine thread, KV pool, tokenizer, template,
parsers and metrics), so the handlers need not know about the pool.

- Loads run one at a time (each one's memory is measured after the last: see launcher.pool_engine_config)
  and in a worker thread: the other models keep serving.
- At most --max-loaded-models models are loaded (the default one included; the shipped embedding model,
  wslm/embed_model.py, is not counted: 90 MB and no KV cache, it embeds a chat's documents beside whichever
  chat model is loaded, and counting it would unload the chat model at every send). Loading one more first unloads
  the least recently used loaded model that has no requests in flight (or waiting); when every one is busy
  the request gets 503 with Retry-After.
- A model is unloaded once idle for its keep-alive: --model-ttl, or the `keep_alive` of its last request
  (Ollama's: seconds or "5m"; 0 unloads after that request, negative keeps it loaded).
- A failed load (bad file, out of memory) answers 500 / 503 naming the model and the cause; the other
  models are untouched and the next request tries again."""

from __future__ import annotations

import asyncio
import gc
import logging
import re
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import get_route_path
from starlette.types import Receive, Scope, Send

from wslm.backend.entrypoints.openai.errors import APIError, bad_request
from wslm.backend.entrypoints.openai.http_limits import load_json
from wslm.embed_model import is_embed_model

log = logging.getLogger("wslm.server")

ServerStateT = Any  # serving_base.ServerState (not imported: serving_base refers to the pool by duck type)
Loader = Callable[[str, str], ServerStateT]  # (model, served name) -> a ready ServerState; blocking
Handler = Callable[[ServerStateT, Request], Awaitable[Response]]

_UNSET: Any = object()  # a request that did not send keep_alive
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(value: Any, what: str = "keep_alive") -> float | None:
    """Seconds a model stays loaded after a request, as Ollama reads keep_alive: a number of seconds or a Go
    duration ("5m", "1h30m", "300ms"); negative: no limit (None); 0: unload at once. ValueError names what
    is wrong."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{what} must be a number of seconds or a duration like \"5m\", got {value!r}.")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip()
        try:
            seconds = float(text)
        except ValueError:
            sign, body = (-1.0, text[1:]) if text.startswith("-") else (1.0, text)
            parts = _DURATION.findall(body)
            if not body or "".join(n + u for n, u in parts) != body:
                raise ValueError(f"{what} must be a number of seconds or a duration like \"5m\", \"1h30m\" or "
                                 f"\"-1\" (keep loaded), got {value!r}.") from None
            seconds = sign * sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise ValueError(f"{what} must be a finite number of seconds, got {value!r}.")
    return None if seconds < 0 else seconds


def parse_pool_spec(spec: str) -> tuple[str, str]:
    """(served name, model) from a --model-pool entry: MODEL (named as given, like --served-model-name's
    default) or NAME=MODEL. A path that exists is a model even if it holds '='."""
    import os

    if "=" in spec and not os.path.exists(os.path.expanduser(spec)):
        name, _, model = spec.partition("=")
        if name.strip() and model.strip():
            return name.strip(), model.strip()
    return spec, spec


@dataclass(eq=False)
class PoolModel:
    """One model the pool may load."""

    name: str  # the API name (`model` in requests, `id` in /v1/models)
    model: str  # what to load: a `wslm models list` name, a path, a repo id in the HF cache
    state: ServerStateT | None = None  # when loaded
    loading: asyncio.Future | None = None  # while loading: what every waiting request awaits
    in_flight: int = 0  # requests running on it (until their last byte is sent)
    waiting: int = 0  # requests waiting for it to load
    last_used: float = 0.0
    keep_alive: float | None = None  # seconds idle before unloading (None: no limit)
    parent: str | None = None  # a LoRA adapter's base model (--lora-modules), as vLLM's /v1/models says
    root: str | None = None  # and the adapter's folder
    loads: int = 0  # how many times it was loaded (shown in /v1/models)
    error: str | None = None  # why the last load failed
    load_started: float | None = None
    counted: bool = True  # counts toward --max-loaded-models (not the shipped embedding model)

    @property
    def busy(self) -> bool:
        return self.in_flight > 0 or self.waiting > 0

    @property
    def status(self) -> str:
        """LM Studio's state names, plus "loading"."""
        if self.state is not None:
            return "loaded"
        return "loading" if self.loading is not None else "not-loaded"


class PoolBusy(APIError):
    """503 with Retry-After: no loaded model can be unloaded for this one now (all have requests)."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message, 503, code="model_pool_full")
        self.retry_after = retry_after


@dataclass(eq=False)
class ModelPool:
    """The default ServerState (--model) plus models loaded on request; see the module's doc."""

    default: ServerStateT
    load: Loader  # builds a model's ServerState (blocking: run in a worker thread)
    models: list[tuple[str, str]] = field(default_factory=list)  # (name, model) servable on request
    max_loaded: int = 2  # models loaded at once, the default one included
    ttl: float | None = 300.0  # idle seconds before unloading (None: until evicted)
    load_timeout: float = 600.0  # how long a request waits for a load before 503 + Retry-After
    refresh: Callable[[], list[tuple[str, str]]] | None = None  # `--model-pool all`: rescan the local models
    unload: Callable[[ServerStateT], None] | None = None  # stops a state's engine (default: stop_state)
    clock: Callable[[], float] = time.monotonic
    # The app's /v1/models card of a loaded model (app.py sets it, with the `created` time it shows).
    describe: Callable[[ServerStateT, str], dict] | None = None
    created: int = 0

    def __post_init__(self) -> None:
        self.entries: dict[str, PoolModel] = {}
        self._add(self.models)
        self.draining = False
        self._grace = 0.0
        self._lock: asyncio.Lock | None = None  # loads and unloads, one at a time
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._reaper: asyncio.Task | None = None
        self._tasks: set[asyncio.Future] = set()
        self._refreshed = 0.0

    # ---- lifecycle (app lifespan, launcher) ----
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._reaper = asyncio.ensure_future(self._reap())

    def stop(self) -> None:
        """Server shutdown: stop every model loaded on request (the default one is the launcher's)."""
        if self._reaper is not None:
            self._reaper.cancel()
        for entry in self.entries.values():
            state, entry.state = entry.state, None
            if state is not None:
                self._stop(state)

    def load_lock(self) -> tuple[asyncio.Lock, asyncio.AbstractEventLoop] | None:
        """The lock every load holds and its loop, for a load outside the pool (the default model's core started
        again after it died, frontend/core_restart.py): loads run one at a time, each sized after the last."""
        return None if self._lock is None or self._loop is None else (self._lock, self._loop)

    def begin_drain(self, grace_s: float) -> None:
        """SIGTERM/SIGINT: no more loads; loaded models finish their requests as the default one does."""
        self.draining = True
        self._grace = grace_s
        for entry in self.entries.values():
            if entry.state is not None:
                entry.state.engine.begin_drain(grace_s)

    # ---- what the app asks ----
    def names(self) -> list[str]:
        return list(self.default.served_model_names) + list(self.entries)

    def entry(self, name: Any) -> PoolModel | None:
        return self.entries.get(name) if isinstance(name, str) else None

    async def find(self, name: Any) -> PoolModel | None:
        """The pool model a request names; with `--model-pool all` an unknown name rescans the local models
        (a model pulled since start is servable without a restart)."""
        entry = self.entry(name)
        if entry is None and isinstance(name, str) and name and not self._is_default(name):
            await self.rescan()
            entry = self.entry(name)
        return entry

    async def rescan(self) -> None:
        if self.refresh is None or self.clock() - self._refreshed < 2.0:
            return
        self._refreshed = self.clock()
        try:
            found = await asyncio.to_thread(self.refresh)
        except Exception:  # noqa: BLE001 - the models already known keep being served
            log.exception("Listing the local models for --model-pool all failed")
            return
        listed = {name for name, _ in found}
        for name in [n for n, e in self.entries.items() if n not in listed and e.status == "not-loaded" and not e.busy]:
            del self.entries[name]  # removed from disk (`wslm models rm`)
        self._add(found)

    def _add(self, models: list[tuple[str, str]]) -> None:
        for name, model in models:
            if name not in self.entries and not self._is_default(name):
                self.entries[name] = PoolModel(name, model, keep_alive=self.ttl,
                                               counted=not is_embed_model(model))

    def _is_default(self, name: str) -> bool:
        return name in self.default.served_model_names or name in self.default.aliases

    async def serve(self, handler: Handler, request: Request) -> Response:
        """Run handler on the ServerState of the model the request body names (POST); everything else on the
        default one."""
        if request.method != "POST":
            return await handler(self.default, request)
        name, keep_alive = _peek(await request.body())
        entry = await self.find(name)
        if entry is None:  # the default model, or a name nobody serves (the handler answers 404)
            return await handler(self.default, request)
        try:
            keep = _UNSET if keep_alive is _UNSET else parse_keep_alive(keep_alive)
        except ValueError as exc:
            return _error(request, bad_request(str(exc), param="keep_alive"))
        try:
            state = await self.acquire(entry)
        except APIError as exc:
            return _error(request, exc)
        try:
            response = await handler(state, request)
        except BaseException:
            self.release(entry, keep)
            raise
        return _Releasing(response, lambda: self.release(entry, keep))

    # ---- loading and unloading ----
    async def acquire(self, entry: PoolModel) -> ServerStateT:
        """The loaded model's state, loading it first (evicting the least recently used idle model if the
        pool is full); counts the caller in flight until release(). Raises APIError (503 busy or timed out,
        500/503 load failure)."""
        entry.waiting += 1
        try:
            deadline = self.clock() + self.load_timeout
            while True:
                state = entry.state
                if state is not None and state.engine.alive:
                    entry.in_flight += 1
                    entry.last_used = self.clock()
                    return state
                if state is not None:  # its engine loop died: unload it and load it afresh
                    log.error("The engine of model %r stopped (%s); loading it again.", entry.name,
                              state.engine.dead)
                    self._unload_later(entry, "its engine stopped")
                if self.draining:
                    raise APIError("The server is shutting down and loads no more models.", 503)
                if entry.loading is None:
                    victims = self._make_room(entry)
                    entry.loading = asyncio.ensure_future(self._load(entry, victims))
                    # Retrieved here too: waiters that timed out must not leave a failure unretrieved.
                    entry.loading.add_done_callback(lambda f: f.cancelled() or f.exception())
                    entry.load_started = self.clock()
                try:
                    await asyncio.wait_for(asyncio.shield(entry.loading), max(0.0, deadline - self.clock()))
                except asyncio.TimeoutError:
                    raise PoolBusy(f"The model `{entry.name}` is still loading after {self.load_timeout:g} s "
                                   "(--model-load-timeout); retry shortly, the load goes on.", 10) from None
        finally:
            entry.waiting -= 1

    def release(self, entry: PoolModel, keep_alive: Any = _UNSET) -> None:
        """A request on entry ended: restart its idle clock with the request's keep_alive (else --model-ttl),
        as Ollama does; keep_alive 0 unloads it now if nothing else runs on it."""
        entry.in_flight -= 1
        entry.last_used = self.clock()
        entry.keep_alive = self.ttl if keep_alive is _UNSET else keep_alive
        if entry.keep_alive == 0 and not entry.busy and entry.state is not None:
            self._unload_later(entry, "keep_alive 0")
        if self._wake is not None:
            self._wake.set()

    async def unload_now(self, entry: PoolModel, why: str) -> None:
        task = self._unload_later(entry, why)
        if task is not None:
            await task

    def _make_room(self, entry: PoolModel) -> list[ServerStateT]:
        """The states to unload before entry loads (detached at once: no request can reach them now)."""
        if not entry.counted:
            return []
        occupied = [e for e in self.entries.values()
                    if e is not entry and e.counted and (e.state is not None or e.loading)]
        victims: list[PoolModel] = []
        while 1 + len(occupied) - len(victims) + 1 > self.max_loaded:  # 1: the default model
            idle = [e for e in occupied if e not in victims and e.state is not None and not e.loading and not e.busy]
            if not idle:
                names = ", ".join(f"`{e.name}`" for e in occupied) or "none"
                raise PoolBusy(
                    f"Cannot load the model `{entry.name}` now: {self.max_loaded} models are loaded or loading "
                    f"(--max-loaded-models {self.max_loaded}), and none can be unloaded: the default model stays "
                    f"loaded and the others ({names}) have requests running. Retry shortly, or start the server "
                    "with a higher --max-loaded-models.", 5)
            victims.append(min(idle, key=lambda e: e.last_used))
        states = []
        for victim in victims:
            log.info("Unloading model %r (least recently used) to make room for %r (--max-loaded-models %d).",
                     victim.name, entry.name, self.max_loaded)
            states.append(victim.state)
            victim.state = None
        return states

    async def _load(self, entry: PoolModel, victims: list[ServerStateT]) -> None:
        assert self._lock is not None, "ModelPool.start() was not called"
        try:
            async with self._lock:
                for state in victims:
                    await asyncio.to_thread(self._stop, state)
                log.info("Loading model %r (%s) on request.", entry.name, entry.model)
                started = time.monotonic()
                try:
                    state = await asyncio.to_thread(self.load, entry.model, entry.name)
                except Exception as exc:  # noqa: BLE001 - any failure is this model's alone
                    await asyncio.to_thread(_free_memory)
                    entry.error = str(exc) or type(exc).__name__
                    log.error("Loading model %r failed: %s", entry.name, entry.error)
                    raise load_error(entry.name, exc) from exc
                state.engine.start(asyncio.get_running_loop())
                loop = asyncio.get_running_loop()
                state.engine.on_death = lambda why: loop.call_soon_threadsafe(self._died, entry, state, why)
                if self.draining:
                    state.engine.begin_drain(self._grace)
                entry.state, entry.error = state, None
                entry.loads += 1
                entry.last_used = self.clock()
                entry.keep_alive = self.ttl
                log.info("Model %r loaded in %.1f s (%d of at most %d models loaded).", entry.name,
                         time.monotonic() - started, self.loaded_count(), self.max_loaded)
        finally:
            entry.loading = None
            entry.load_started = None
            if self._wake is not None:
                self._wake.set()

    def loaded_count(self) -> int:
        """Loaded models that count toward --max-loaded-models, the default one included."""
        return 1 + sum(e.state is not None and e.counted for e in self.entries.values())

    def _unload_later(self, entry: PoolModel, why: str) -> asyncio.Future | None:
        state, entry.state = entry.state, None
        if state is None:
            return None
        log.info("Unloading model %r (%s).", entry.name, why)

        async def run() -> None:
            assert self._lock is not None
            async with self._lock:
                await asyncio.to_thread(self._stop, state)

        task = asyncio.ensure_future(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _died(self, entry: PoolModel, state: ServerStateT, why: str) -> None:
        """A pool model's engine loop stopped: it is unloaded; the server and the other models go on (the
        default model's core process starts again on its next request instead: frontend/core_restart.py)."""
        log.error("The engine of model %r stopped (%s): unloading it; the next request loads it again.",
                  entry.name, why)
        if entry.state is state:
            self._unload_later(entry, "its engine stopped")

    def _stop(self, state: ServerStateT) -> None:
        try:
            (self.unload or stop_state)(state)
        except Exception:  # noqa: BLE001 - unloading must never take the server down
            log.exception("Stopping a model's engine failed")

    async def _reap(self) -> None:
        """Unload models idle past their keep-alive; sleeps until the next one is due (or a request ends)."""
        assert self._wake is not None
        while True:
            now = self.clock()
            wait = 60.0
            for entry in list(self.entries.values()):
                if entry.state is None or entry.busy or entry.keep_alive is None:
                    continue
                left = entry.last_used + entry.keep_alive - now
                if left <= 0:
                    self._unload_later(entry, f"idle for {entry.keep_alive:g} s")
                else:
                    wait = min(wait, left)
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), max(0.05, wait))
            except asyncio.TimeoutError:
                pass

    # ---- what /v1/models, /metrics show ----
    def cards(self) -> list[dict]:
        """GET /v1/models: every servable model, loaded or not, with its state."""
        out = [{**self._describe(self.default, n), "state": "loaded"} for n in self.default.served_model_names]
        return out + [self.card(e) for e in self.entries.values()]

    def card(self, entry: PoolModel) -> dict:
        """A loaded model's full card (as without a pool); an unloaded one's says what the pool knows."""
        if entry.state is not None:
            out = self._describe(entry.state, entry.name)
        else:
            out = {"id": entry.name, "object": "model", "created": self.created, "owned_by": "wslm",
                   "root": entry.model, "parent": None}
        if entry.parent is not None:
            out["parent"], out["root"] = entry.parent, entry.root
        out["state"] = entry.status
        if entry.keep_alive is not None and entry.state is not None:
            out["expires_in"] = max(0, round(entry.last_used + entry.keep_alive - self.clock()))
        if entry.error and entry.state is None:
            out["load_error"] = entry.error
        return out

    def _describe(self, state: ServerStateT, name: str) -> dict:
        if self.describe is None:
            return {"id": name, "object": "model", "created": self.created, "owned_by": "wslm"}
        return self.describe(state, name)

    def render_metrics(self) -> str:
        """Every loaded model's metrics (one model_name label each) in one exposition, each family once,
        plus wslm:model_loaded (1/0) for every servable model."""
        texts = [self.default.metrics.render() if self.default.metrics is not None else ""]
        texts += [e.state.metrics.render() for e in self.entries.values()
                  if e.state is not None and e.state.metrics is not None]
        loaded = ["# HELP wslm:model_loaded 1 when the model is loaded (--model-pool), else 0.",
                  "# TYPE wslm:model_loaded gauge"]
        for name in self.default.served_model_names[:1]:
            loaded.append(f'wslm:model_loaded{{model_name="{_escape(name)}"}} 1')
        for entry in self.entries.values():
            loaded.append(f'wslm:model_loaded{{model_name="{_escape(entry.name)}"}} {int(entry.state is not None)}')
        return merge_metrics(texts) + "\n".join(loaded) + "\n"


def merge_metrics(texts: list[str]) -> str:
    """Prometheus texts merged so that each family's HELP/TYPE comes once, its samples together."""
    families: dict[str, list[str]] = {}
    current = ""
    for text in texts:
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                current = line.split(" ", 3)[2]
                lines = families.setdefault(current, [])
                if line not in lines:
                    lines.append(line)
            elif line:
                families.setdefault(current, []).append(line)
    return "".join(line + "\n" for lines in families.values() for line in lines)


def stop_state(state: ServerStateT) -> None:
    """Stop a model's engine thread and workers and give its memory back."""
    state.engine.stop()
    _free_memory()


def _free_memory() -> None:
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()  # the unloaded model's blocks back to the card, for the next load


def load_error(name: str, exc: BaseException) -> APIError:
    """A failed load as an HTTP error: out of memory is 503 (retry later, or unload another model), anything
    else 500; both name the model and the cause."""
    chain, seen = [], exc
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    oom = any(isinstance(e, MemoryError) or "OutOfMemory" in type(e).__name__ for e in chain)
    message = f"Could not load the model `{name}`: {exc}"
    if oom:
        return APIError(message + " Unload another model (POST /v1/models/unload), lower --max-loaded-models, "
                        "or give each model less KV cache.", 503, code="out_of_memory")
    return APIError(message, 500, type="server_error", code="model_load_failed")


def _peek(body: bytes) -> tuple[Any, Any]:
    """(model, keep_alive) of a JSON body; (None, unset) if it is not a JSON object (the handler says why)."""
    if not body.strip():
        return None, _UNSET
    try:
        data = load_json(body)
    except Exception:  # noqa: BLE001 - the handler parses the body again and answers the 400
        return None, _UNSET
    if not isinstance(data, dict):
        return None, _UNSET
    return data.get("model"), data.get("keep_alive", _UNSET)


def _error(request: Request, exc: APIError) -> Response:
    if get_route_path(request.scope).startswith("/v1/messages"):
        from wslm.backend.entrypoints.openai.serving_messages import anthropic_error

        response = anthropic_error(exc)
    else:
        response = exc.response()
    if isinstance(exc, PoolBusy):
        response.headers["Retry-After"] = str(exc.retry_after)
    return response


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class _Releasing(Response):
    """The handler's response, and release() once its last byte is sent (a stream runs after the handler
    returned: the model must stay loaded until it ends)."""

    def __init__(self, inner: Response, done: Callable[[], None]) -> None:  # noqa: D107 - no super(): a wrapper
        self.inner = inner
        self.done = done
        self.background = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.background is not None and self.inner.background is None:
            self.inner.background = self.background
        try:
            await self.inner(scope, receive, send)
        finally:
            self.done()


# ---- POST /v1/models/load and /v1/models/unload (what a GUI's model picker uses) ----
async def load_model(state: ServerStateT, request: Request) -> Response:
    """Load a model now (the first chat then finds it ready): {"model": NAME, "keep_alive"?: ...}; answers
    its /v1/models card."""
    pool, entry, keep = await _admin_target(state, request)
    if entry is None:  # the default model: always loaded
        return JSONResponse(pool.cards()[0])
    try:
        await pool.acquire(entry)
    except PoolBusy as exc:
        return _error(request, exc)  # with its Retry-After
    pool.release(entry, keep)
    return JSONResponse(pool.card(entry))


async def unload_model(state: ServerStateT, request: Request) -> Response:
    """Unload a model now: {"model": NAME}; 409 while it has requests running, 400 for the default model."""
    pool, entry, _ = await _admin_target(state, request)
    if entry is None:
        raise bad_request("The model served at start (--model) stays loaded; only models of --model-pool are "
                          "unloaded.", param="model")
    if entry.busy:
        raise APIError(f"The model `{entry.name}` has {entry.in_flight + entry.waiting} requests running or "
                       "waiting; unload it when they are done.", 409, param="model", code="model_busy")
    if entry.loading is not None:
        await asyncio.shield(entry.loading)
    await pool.unload_now(entry, "POST /v1/models/unload")
    return JSONResponse(pool.card(entry))


async def _admin_target(state: ServerStateT, request: Request) -> tuple[ModelPool, PoolModel | None, Any]:
    pool: ModelPool = state.model_pool
    body = load_json(await request.body()) if (await request.body()).strip() else None
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        raise bad_request('Send a JSON object naming the model, e.g. {"model": "NAME"} (see GET /v1/models).',
                          param="model")
    name = body["model"]
    try:
        keep = parse_keep_alive(body["keep_alive"]) if "keep_alive" in body else _UNSET
    except ValueError as exc:
        raise bad_request(str(exc), param="keep_alive") from exc
    entry = await pool.find(name)
    if entry is None:
        state.check_model(name)  # 404 naming every servable model, unless it is the default one
    return pool, entry, keep
