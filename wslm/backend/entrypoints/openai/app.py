"""The FastAPI app: routes, API-key check on /v1/*, and errors in OpenAI's shape everywhere
(400 instead of FastAPI's 422, no tracebacks in responses)."""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import get_route_path
from starlette.types import ASGIApp, Receive, Scope, Send

from wslm import __version__
from wslm.backend.entrypoints.ollama import routes as ollama_routes
from wslm.backend.entrypoints.openai import (
    http_limits,
    model_pool,
    security,
    serving_chat,
    serving_completion,
    serving_embedding,
    serving_lora,
    serving_messages,
    serving_responses,
    serving_score,
    serving_tokens,
    serving_vllm,
)
from wslm.backend.entrypoints.openai.errors import APIError, http_status_error, internal_error
from wslm.backend.entrypoints.openai.http_limits import BodySizeLimitMiddleware, HeaderLimitMiddleware
from wslm.backend.entrypoints.openai.serving_base import ServerState

log = logging.getLogger("wslm.server")

Handler = Callable[[ServerState, Request], Awaitable[Response]]


def build_app(state: ServerState, root_path: str = "", docs: bool = True) -> FastAPI:
    """root_path: --root-path, the prefix a reverse proxy serves us under (routes answer with and without
    it, as vLLM's); docs: False for --disable-fastapi-docs."""
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.engine.start(asyncio.get_running_loop())
        if state.model_pool is not None:
            state.model_pool.start()
        try:
            yield
        finally:
            if state.model_pool is not None:
                state.model_pool.stop()
            state.engine.stop()

    app = FastAPI(title="wslm", version=__version__, lifespan=lifespan, docs_url="/docs" if docs else None,
                  redoc_url=None, openapi_url="/openapi.json" if docs else None, root_path=root_path)
    app.state.wslm = state

    def route(handler: Handler, by_model: bool = True) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                if state.model_pool is not None and by_model:  # --model-pool: the body's `model` picks the state
                    return await state.model_pool.serve(handler, request)
                return await handler(state, request)
            except APIError as exc:
                return exc.response()
            except Exception as exc:  # noqa: BLE001 - a 500 with a message; the server keeps serving
                log.exception("%s %s failed", request.method, request.url.path)
                return internal_error(exc).response()

        endpoint.__name__ = handler.__name__
        return endpoint

    app.add_api_route("/v1/chat/completions", route(serving_chat.create_chat_completion), methods=["POST"])
    app.add_api_route("/v1/completions", route(serving_completion.create_completion), methods=["POST"])
    app.add_api_route("/v1/messages", route(serving_messages.create_message), methods=["POST"])
    app.add_api_route("/v1/messages/count_tokens", route(serving_messages.count_tokens), methods=["POST"])
    app.add_api_route("/v1/responses", route(serving_responses.create_response), methods=["POST"])
    app.add_api_route("/v1/responses/{response_id}", route(serving_responses.get_response), methods=["GET"])
    app.add_api_route("/v1/responses/{response_id}", route(serving_responses.delete_response), methods=["DELETE"])
    app.add_api_route("/v1/responses/{response_id}/cancel", route(serving_responses.cancel_response),
                      methods=["POST"])
    app.add_api_route("/tokenize", route(serving_tokens.tokenize), methods=["POST"])
    app.add_api_route("/detokenize", route(serving_tokens.detokenize), methods=["POST"])
    app.add_api_route("/v1/models", route(_list_models), methods=["GET"])
    app.add_api_route("/v1/models/{model_id:path}", route(_get_model), methods=["GET"])
    if state.model_pool is not None:  # load/unload by hand (a GUI's model picker), model_pool.py
        state.model_pool.describe, state.model_pool.created = _model_card, _STARTED
        app.add_api_route("/v1/models/load", route(model_pool.load_model, by_model=False), methods=["POST"])
        app.add_api_route("/v1/models/unload", route(model_pool.unload_model, by_model=False), methods=["POST"])
    app.add_api_route("/v1/load_lora_adapter", route(serving_lora.load_lora_adapter, by_model=False),
                      methods=["POST"])
    app.add_api_route("/v1/unload_lora_adapter", route(serving_lora.unload_lora_adapter, by_model=False),
                      methods=["POST"])
    app.add_api_route("/health", route(_health), methods=["GET"])
    app.add_api_route("/version", route(_version), methods=["GET"])
    app.add_api_route("/metrics", route(_metrics), methods=["GET"])
    app.add_api_route("/load", route(serving_vllm.get_load), methods=["GET"])
    if state.enable_tokenizer_info_endpoint:
        app.add_api_route("/tokenizer_info", route(serving_vllm.get_tokenizer_info), methods=["GET"])
    app.add_api_route("/v1/embeddings", route(serving_embedding.create_embedding), methods=["POST"])
    for path in ("/score", "/v1/score"):
        app.add_api_route(path, route(serving_score.create_score), methods=["POST"])
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        app.add_api_route(path, route(serving_score.create_rerank), methods=["POST"])
    invocation_routes = {"messages": serving_chat.create_chat_completion,
                         "prompt": serving_completion.create_completion,
                         "input": serving_embedding.create_embedding,
                         "query": serving_score.create_rerank,
                         "text_1": serving_score.create_score}
    app.add_api_route("/invocations", route(serving_vllm.invocations(invocation_routes)), methods=["POST"])
    ollama_routes.register(app, route)  # Ollama's API (/api/chat, /api/generate, /api/tags, ...) on this port

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404 and exc.detail in (None, "Not Found"):
            return unknown_route(get_route_path(request), request.method, app).response()
        return http_status_error(exc.status_code, exc.detail).response()

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> Response:
        return exc.response()

    http_limits.current = state.http_limits
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=state.http_limits.max_request_body_bytes)
    if state.enable_server_load_tracking:
        app.add_middleware(serving_vllm.LoadTrackingMiddleware, state=state)
    if state.api_key:  # outside the body limit: a client without the key is refused before any reading
        guarded = _GUARDED + (UTILITY_PATHS if state.guard_utility_endpoints else ())
        app.add_middleware(APIKeyMiddleware, api_key=state.api_key, guarded=guarded)
    # Outside the key check, so that 401s carry CORS headers too. Loopback pages and --allowed-origins only:
    # any other web page is refused by OriginCheckMiddleware (security.py says why).
    origins = state.allowed_origins or []
    methods, headers, credentials = state.cors
    app.add_middleware(CORSMiddleware, allow_origins=origins, allow_origin_regex=security.LOOPBACK_ORIGIN_PATTERN,
                       allow_methods=methods, allow_headers=headers, allow_credentials=credentials)
    app.add_middleware(security.OriginCheckMiddleware, allowed_origins=origins)
    if state.bound_host is not None and security.is_loopback(state.bound_host):
        app.add_middleware(security.HostCheckMiddleware, allowed_hosts=state.allowed_hosts)
    app.add_middleware(HeaderLimitMiddleware, limits=state.http_limits)  # outermost: before any header is read
    return app


def unknown_route(path: str, method: str, app: FastAPI) -> APIError:
    """The 404 for a path no route serves: under /v1, the endpoints this server has; elsewhere, where the
    API lives (clients configured without /v1 land here)."""
    if not (path == "/v1" or path.startswith("/v1/")):
        return http_status_error(404)
    served = [f"{m} {r.path.replace(':path', '')}" for r in app.routes if getattr(r, "path", "").startswith("/v1/")
              for m in sorted(getattr(r, "methods", None) or ()) if m != "HEAD"]
    return APIError(f"Unknown endpoint: {method} {path}. This server serves {', '.join(served)}.", 404,
                    code="unknown_endpoint")


_GUARDED = ("/v1", "/v2", "/api/", "/invocations", "/score", "/rerank", "/pooling", "/classify")
# Open without the key on loopback, as vLLM's; guarded too when the server listens beyond loopback (unless
# --public-utility-endpoints): /tokenize renders the chat template over large bodies for anyone, /metrics
# and /docs describe the server. /health and /version stay open for probes and load balancers.
UTILITY_PATHS = ("/tokenize", "/detokenize", "/tokenizer_info", "/metrics", "/load", "/docs", "/redoc",
                 "/openapi.json")


class APIKeyMiddleware:
    """401 on the model endpoints (/v1/*, /invocations, /score, /rerank, ...) without `Authorization: Bearer
    <key>`; /health, /metrics, /version stay open (as vLLM), unless `guarded` names them (UTILITY_PATHS).
    Paths are taken after --root-path, so a prefixed path is checked the same."""

    def __init__(self, app: ASGIApp, api_key: str, guarded: tuple[str, ...] = _GUARDED) -> None:
        self.app = app
        self.key = api_key.encode()
        self.guarded = guarded

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = get_route_path(scope) if scope["type"] == "http" else ""
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or not path.startswith(self.guarded):
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    given = token.strip()
                break
            if name == b"x-api-key":  # Anthropic's clients send the key this way (/v1/messages)
                given = value.strip()
        if hmac.compare_digest(given, self.key):  # constant time: the key cannot be guessed byte by byte
            await self.app(scope, receive, send)
            return
        why = "No API key was provided" if not given else "Incorrect API key provided"
        error = APIError(f"{why}. Send it as `Authorization: Bearer <key>` or `x-api-key: <key>` (the key the "
                         "server was started with: --api-key or WSLM_API_KEY).", 401, code="invalid_api_key")
        if path.startswith("/v1/messages"):
            await serving_messages.anthropic_error(error)(scope, receive, send)
            return
        await error.response()(scope, receive, send)


def _model_card(state: ServerState, name: str) -> dict:
    return {
        "id": name,
        "object": "model",
        "created": _STARTED,
        "owned_by": "wslm",
        "root": state.model_path or name,
        "parent": None,
        "max_model_len": state.max_model_len,
        "permission": [serving_vllm.model_permission(_STARTED)],  # vLLM's ModelPermission list
        # What the model can do (the GUI and clients pick endpoints by it): vLLM's task name, and the API
        # capabilities it gives.
        "task": state.task,
        "capabilities": _CAPABILITIES.get(state.task) or _generate_capabilities(state),
    }


def _generate_capabilities(state: ServerState) -> list[str]:
    """A generating model's APIs, plus tool calls with tool_choice "auto" and reasoning when a parser is on."""
    caps = ["completion", "chat", "messages", "responses"]
    if state.enable_auto_tool_choice and state.tool_call_parser:
        caps.append("tool_calls")
    if state.reasoning_parser:
        caps.append("reasoning")
    return caps


_STARTED = int(time.time())
_CAPABILITIES = {"embed": ["embeddings"], "score": ["score", "rerank"]}


async def _list_models(state: ServerState, request: Request) -> Response:
    if state.model_pool is not None:  # every servable model, loaded or not, with its `state`
        await state.model_pool.rescan()
        cards = state.model_pool.cards()
    else:
        cards = [_model_card(state, n) for n in state.served_model_names]
    return JSONResponse({"object": "list", "data": cards + _lora_cards(state)})


def _lora_cards(state: ServerState) -> list[dict]:
    """Each LoRA adapter, with the base as its `parent` (vLLM's /v1/models)."""
    if state.lora is None:
        return []
    template = _model_card(state, state.model_name)
    return [state.lora.card(req, template) for req in state.lora.adapters.values()]


async def _get_model(state: ServerState, request: Request) -> Response:
    if state.model_pool is not None and (entry := await state.model_pool.find(request.path_params["model_id"])):
        return JSONResponse(state.model_pool.card(entry))
    if state.lora is not None and (req := state.lora.get(request.path_params["model_id"])):
        return JSONResponse(state.lora.card(req, _model_card(state, state.model_name)))
    name = state.check_model(request.path_params["model_id"])
    return JSONResponse(_model_card(state, name))


async def _health(state: ServerState, request: Request) -> Response:
    if not state.engine.alive:
        why = state.engine.dead or "not started"
        return JSONResponse({"status": "error", "message": f"The engine loop is not running ({why})."},
                            status_code=503)
    return Response(status_code=200)


async def _version(state: ServerState, request: Request) -> Response:
    return JSONResponse({"version": __version__})


async def _metrics(state: ServerState, request: Request) -> Response:
    text = state.metrics.render() if state.metrics is not None else ""
    if state.model_pool is not None:  # every loaded model's, each under its model_name label
        text = state.model_pool.render_metrics()
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")
