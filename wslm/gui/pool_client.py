"""Our server's model pool (`wslm serve --model-pool`, docs/model-pool.md), as the chat sees it: which models
the server can serve and in which `state` (GET /v1/models), loading one on request (POST /v1/models/load),
so that picking another model in the chat loads it beside the running one instead of restarting the server,
and ejecting one (POST /v1/models/unload) to give its memory back.

Holds no widgets. The HTTP runs on background threads (BackgroundCall); answers come back as signals, and an
answer from a server that has since stopped or restarted is dropped."""

from __future__ import annotations

import json
import logging

import httpx
from PySide6.QtCore import QObject, QTimer, Signal

import wslm.gui.qt_fix  # noqa: F401  (PySide6 6.12 emit() refcount bug)
from wslm.gui.background import BackgroundCall
from wslm.gui.chat_errors import _server_message

log = logging.getLogger(__name__)

LIST_TIMEOUT_S = 15.0
# A big model loads for minutes on a CPU; the server answers 503 itself after its --model-load-timeout (600 s).
LOAD_TIMEOUT_S = 900.0
POLL_MS = 1000  # while a load runs: /v1/models again, for its `state`
UNLOAD_TIMEOUT_S = 120.0  # the server frees the model's memory before it answers


def _headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def fetch_models(base_url: str, api_key: str = "") -> list[dict]:
    """GET /v1/models: the cards (blocking; run it off the GUI thread)."""
    resp = httpx.get(base_url.rstrip("/") + "/models", headers=_headers(api_key), timeout=LIST_TIMEOUT_S)
    resp.raise_for_status()
    data = resp.json().get("data")
    return [m for m in data if isinstance(m, dict) and m.get("id")] if isinstance(data, list) else []


def post_load(base_url: str, model: str, api_key: str = "") -> tuple[int, dict, str]:
    """POST /v1/models/load: (HTTP status, the model's card or {}, the server's error message or "")."""
    return _post_model(base_url, "/models/load", model, api_key, LOAD_TIMEOUT_S)


def post_unload(base_url: str, model: str, api_key: str = "") -> tuple[int, dict, str]:
    """POST /v1/models/unload: (HTTP status, the model's card or {}, the server's error message or "")."""
    return _post_model(base_url, "/models/unload", model, api_key, UNLOAD_TIMEOUT_S)


def _post_model(base_url: str, path: str, model: str, api_key: str, read_s: float) -> tuple[int, dict, str]:
    timeout = httpx.Timeout(connect=5.0, read=read_s, write=30.0, pool=5.0)
    resp = httpx.post(base_url.rstrip("/") + path, json={"model": model}, headers=_headers(api_key),
                      timeout=timeout)
    if resp.status_code >= 400:
        return resp.status_code, {}, _server_message(resp.text) or f"HTTP {resp.status_code}"
    try:
        card = resp.json()
    except json.JSONDecodeError:
        card = {}
    return resp.status_code, card if isinstance(card, dict) else {}, ""


class ModelPoolClient(QObject):
    changed = Signal()  # the cards were read anew (states, or the server went away)
    load_progress = Signal(str, str)  # model, its `state` while it loads ("loading", "not-loaded")
    loaded = Signal(str, dict)  # model, its card (max_model_len, ...)
    load_failed = Signal(str, str)  # model, the server's message (or why it could not be asked)
    unloaded = Signal(str)  # model: the server ejected it (its memory is free)
    unload_failed = Signal(str, str)  # model, the server's message (or why it could not be asked)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.base_url = ""  # our server's …/v1 while it is ready
        self.api_key = ""
        self.cards: dict[str, dict] = {}  # id -> /v1/models card, in the server's order
        self.pooled = False  # the server runs a pool: its cards carry `state` (an older or pool-less one's do not)
        self.loading = ""  # the model a load is running for
        self.unloading: set[str] = set()  # models an eject is running for
        self._generation = 0  # bumped per server: a late answer from the previous one is dropped
        self._poll = QTimer(self, interval=POLL_MS)
        self._poll.timeout.connect(self.refresh)

    # What the server holds
    def set_server(self, base_url: str, api_key: str = "") -> None:
        """Our server became ready (its …/v1 URL) or went away (""): forget the last one's models."""
        self._generation += 1
        self.base_url, self.api_key = base_url, api_key
        self.cards, self.pooled = {}, False
        self._poll.stop()
        had = self.loading
        self.loading = ""
        self.unloading.clear()  # the server went: nothing of it is loaded any more (no answer to wait for)
        if had:
            self.load_failed.emit(had, "the server stopped while the model was loading")
        self.changed.emit()
        if base_url:
            self.refresh()

    def state(self, model: str) -> str:
        """`loaded`, `loading`, `not-loaded`, or "" (not a model this server serves, or not known yet)."""
        return str(self.cards.get(model, {}).get("state") or "")

    def loaded_models(self) -> set[str]:
        return {name for name, card in self.cards.items() if card.get("state") == "loaded"}

    def default_model(self) -> str:
        """The model the server was started with (its --model): listed first, always loaded, never ejected."""
        return next(iter(self.cards), "") if self.pooled else ""

    def can_unload(self, model: str) -> bool:
        """`model` is one the pool loaded on request, loaded now, and no eject of it is running."""
        return bool(self.base_url) and self.pooled and self.state(model) == "loaded" \
            and model != self.default_model() and model not in self.unloading

    def can_load(self, model: str) -> bool:
        """The server can switch to `model` without a restart: it runs a pool that holds it."""
        return bool(self.base_url) and self.pooled and model in self.cards

    def refresh(self) -> None:
        if not self.base_url:
            return
        generation, url, key = self._generation, self.base_url, self.api_key
        call = BackgroundCall(lambda: fetch_models(url, key), self)
        call.done.connect(lambda cards, g=generation: self._on_cards(g, cards))
        call.failed.connect(lambda err: log.info("GET /v1/models failed: %s", err))
        call.start()

    def _on_cards(self, generation: int, cards: list[dict]) -> None:
        if generation != self._generation:
            return
        self.cards = {str(c["id"]): c for c in cards}
        self.pooled = any("state" in c for c in cards)
        if self.state(self.loading) in ("loading", "not-loaded"):  # "loaded": the load's own answer says so
            self.load_progress.emit(self.loading, self.state(self.loading))
        self.changed.emit()

    # Loading
    def load(self, model: str) -> bool:
        """Load `model` into the pool (its answer: `loaded` or `load_failed`); False when another load runs."""
        if not self.base_url or self.loading:
            return False
        self.loading = model
        generation, url, key = self._generation, self.base_url, self.api_key
        call = BackgroundCall(lambda: post_load(url, model, key), self)
        call.done.connect(lambda result, g=generation: self._on_load(g, model, result))
        call.failed.connect(lambda err, g=generation: self._on_load(g, model, (0, {}, err)))
        call.start()
        self._poll.start()
        self.load_progress.emit(model, "loading")  # asked just now; the polls then say what the server says
        return True

    def _on_load(self, generation: int, model: str, result: tuple[int, dict, str]) -> None:
        if generation != self._generation:
            return  # that server is gone (set_server said so already)
        self._poll.stop()
        self.loading = ""
        status, card, error = result
        if error or status >= 400:
            self.load_failed.emit(model, error or f"HTTP {status}")
        else:
            self.cards[model] = {**self.cards.get(model, {}), **card}
            self.loaded.emit(model, card)
        self.refresh()  # what else changed (a model evicted to make room)

    # Ejecting
    def unload(self, model: str) -> bool:
        """Eject `model` from the pool (its answer: `unloaded` or `unload_failed`); False when it cannot be
        (not loaded by the pool, the server's default model, or an eject of it is running)."""
        if not self.can_unload(model):
            return False
        self.unloading.add(model)
        generation, url, key = self._generation, self.base_url, self.api_key
        call = BackgroundCall(lambda: post_unload(url, model, key), self)
        call.done.connect(lambda result, g=generation: self._on_unload(g, model, result))
        call.failed.connect(lambda err, g=generation: self._on_unload(g, model, (0, {}, err)))
        call.start()
        self.changed.emit()  # its row stops offering an eject while it runs
        return True

    def _on_unload(self, generation: int, model: str, result: tuple[int, dict, str]) -> None:
        if generation != self._generation:
            return  # that server is gone, and the model with it
        self.unloading.discard(model)
        status, card, error = result
        if error or status >= 400:
            self.unload_failed.emit(model, error or f"HTTP {status}")
        else:
            # Its card says "not-loaded" now: the badge goes at once, before the list is read again.
            self.cards[model] = {**self.cards.get(model, {}), **card, "state": card.get("state") or "not-loaded"}
            self.changed.emit()
            self.unloaded.emit(model)
        self.refresh()
