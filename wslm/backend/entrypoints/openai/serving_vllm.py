"""vLLM's extra endpoints: GET /load (--enable-server-load-tracking), GET /tokenizer_info
(--enable-tokenizer-info-endpoint) and POST /invocations (SageMaker's one entry point)."""

from __future__ import annotations

import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import get_route_path
from starlette.types import ASGIApp, Receive, Scope, Send

from wslm.backend.entrypoints.openai.errors import bad_request
from wslm.backend.entrypoints.openai.http_limits import load_json
from wslm.backend.entrypoints.openai.serving_base import ServerState

# The routes whose requests use the engine: what GET /load counts (vLLM counts the same kind).
LOADED_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/invocations", "/v1/messages",
                "/pooling", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank", "/classify")


class LoadTrackingMiddleware:
    """Counts the engine requests in flight, from arrival until the last byte of the answer (a stream
    counts until it ends or its client leaves)."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or get_route_path(scope) not in LOADED_PATHS:
            await self.app(scope, receive, send)
            return
        self.state.server_load += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.state.server_load -= 1


def model_permission(created: int) -> dict:
    """The one entry of a /v1/models card's `permission` list, in vLLM's shape: a local server grants all
    its clients the same (sampling, logprobs, viewing; no fine-tuning)."""
    return {"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": created,
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
            "group": None, "is_blocking": False}


async def get_load(state: ServerState, request: Request) -> Response:
    return JSONResponse({"server_load": state.server_load})


async def get_tokenizer_info(state: ServerState, request: Request) -> Response:
    """The tokenizer's configuration (its init arguments, minus file paths), class and chat template."""
    tokenizer = state.tokenizer
    config = dict(getattr(tokenizer, "init_kwargs", None) or {})
    for key in ("vocab_file", "merges_file", "tokenizer_file", "name_or_path"):
        config.pop(key, None)
    info = _jsonable(config)
    info["tokenizer_class"] = type(tokenizer).__name__
    template = state.chat_template or getattr(tokenizer, "chat_template", None)
    if template:
        info["chat_template"] = template
    return JSONResponse(info)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "content") and not isinstance(value, (dict, list, str)):
        return value.content  # AddedToken
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def invocations(routes: dict[str, Any]):
    """POST /invocations: the request's own fields pick the endpoint, as vLLM's (messages: chat, prompt:
    completions, input: embeddings, query: rerank, text_1: score); routes maps field -> handler, in order."""

    async def handler(state: ServerState, request: Request) -> Response:
        body = load_json(await request.body()) if (await request.body()).strip() else None
        if not isinstance(body, dict):
            raise bad_request("POST /invocations needs a JSON object: a chat (`messages`), a completion "
                              "(`prompt`), an embedding (`input`), a rerank (`query`) or a score (`text_1`) request.")
        for key in routes:
            if key in body:
                return await routes[key](state, request)
        kinds = ", ".join(f"`{k}`" for k in routes)
        raise bad_request(f"POST /invocations could not tell what this request is: it has none of {kinds}.")

    handler.__name__ = "invocations"
    return handler
