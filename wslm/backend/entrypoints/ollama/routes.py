"""Ollama's API on the OpenAI server's port (/api/chat, /api/generate, /api/embed, /api/tags, ...), for the
apps that speak it (Open WebUI, Home Assistant, editor plugins, the `ollama` Python client).

Each generating or embedding route builds the OpenAI body and calls the OpenAI handler (serving_chat,
serving_completion, serving_embedding) with it: validation, tool calls, structured output, the model pool
and `keep_alive` all work as they do there. Replies stream as NDJSON, Ollama's framing."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from wslm import __version__
from wslm.backend.entrypoints.ollama import convert
from wslm.backend.entrypoints.openai import serving_chat, serving_completion, serving_embedding
from wslm.backend.entrypoints.openai.errors import APIError, bad_request
from wslm.backend.entrypoints.openai.serving_base import ServerState

Handler = Callable[[ServerState, Request], Awaitable[Response]]

# The Ollama version clients see (some turn features on by it, e.g. `think` from 0.9): the API this module
# follows. wslm's own version is in `wslm_version`.
OLLAMA_API_VERSION = "0.12.0"
NDJSON = "application/x-ndjson"


def register(app: Any, route: Callable[..., Any]) -> None:
    """Add the routes; `route` is app.py's wrapper (errors, the model pool). Ollama's errors are
    {"error": "..."}: every route answers so."""
    posts = {"/api/chat": chat, "/api/generate": generate, "/api/embed": embed, "/api/embeddings": embeddings,
             "/api/show": show}
    for path, handler in posts.items():
        app.add_api_route(path, _ollama_errors(route(handler)), methods=["POST"])
    app.add_api_route("/api/tags", _ollama_errors(route(tags, by_model=False)), methods=["GET"])
    app.add_api_route("/api/ps", _ollama_errors(route(ps, by_model=False)), methods=["GET"])
    app.add_api_route("/api/version", _ollama_errors(route(version, by_model=False)), methods=["GET"])
    app.add_api_route("/api/pull", _ollama_errors(route(pull, by_model=False)), methods=["POST"])
    app.add_api_route("/api/delete", _ollama_errors(route(delete, by_model=False)), methods=["DELETE"])
    for path in ("/api/create", "/api/copy", "/api/push", "/api/blobs/{digest}"):
        app.add_api_route(path, _ollama_errors(route(_not_here, by_model=False)), methods=["POST", "HEAD"])


def _ollama_errors(endpoint: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """Ollama's error shape, {"error": message}, from the OpenAI one; a request naming `demo:latest` is
    served by `demo` (Ollama's default tag)."""
    async def wrapped(request: Request) -> Response:
        request = await _untagged(request)
        response = await endpoint(request)
        inner = getattr(response, "inner", response)  # the model pool wraps it to release the model after
        if response.status_code >= 400 and isinstance(inner, JSONResponse):
            ollama = JSONResponse({"error": convert.error_text(inner.body)}, status_code=inner.status_code,
                                  headers={k: v for k, v in inner.headers.items() if k.lower() == "retry-after"})
            if inner is response:
                return ollama
            response.inner = ollama
        return response

    wrapped.__name__ = getattr(endpoint, "__name__", "ollama")
    return wrapped


async def _untagged(request: Request) -> Request:
    if request.method != "POST":
        return request
    body = await request.body()
    try:
        data = json.loads(body) if body.strip() else None
    except ValueError:
        return request
    if not isinstance(data, dict):
        return request
    name = data.get("model") or data.get("name")  # older clients send `name`
    if isinstance(name, str) and name.endswith(":latest"):
        data["model"] = name[: -len(":latest")]
    elif isinstance(name, str):
        data["model"] = name
    else:
        return request
    return _with_body(request, data)


def _with_body(request: Request, body: dict) -> Request:
    """The same request (client, headers, disconnect) with another JSON body, for the OpenAI handler."""
    raw = json.dumps(body).encode()
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await request.receive()  # http.disconnect when the client leaves

    scope = dict(request.scope)
    scope["headers"] = [(k, v) for k, v in request.scope["headers"] if k != b"content-length"]
    scope["headers"].append((b"content-length", str(len(raw)).encode()))
    return Request(scope, receive)


async def _json_body(request: Request) -> dict:
    body = await request.body()
    try:
        data = json.loads(body) if body.strip() else {}
    except ValueError as exc:
        raise bad_request(f"The body is not JSON ({exc}).") from None
    if not isinstance(data, dict):
        raise bad_request("The body must be a JSON object.")
    return data


# ---- generation ----

async def chat(state: ServerState, request: Request) -> Response:
    body = await _json_body(request)
    convert.require_model(body)
    openai_body = _common(state, body)
    openai_body["messages"] = convert.chat_messages(body.get("messages"))
    if body.get("tools"):
        openai_body["tools"] = body["tools"]
    return await _generate(state, request, body, openai_body, serving_chat.create_chat_completion, "chat")


async def generate(state: ServerState, request: Request) -> Response:
    """A prompt through the chat template (with `system`), or as it is with raw; no prompt loads the model
    (done_reason "load"), or unloads it with keep_alive 0 (the pool acts on keep_alive)."""
    body = await _json_body(request)
    model = convert.require_model(body)
    for unsupported in ("suffix", "template"):
        if body.get(unsupported):
            raise bad_request(f"{unsupported} is not supported by wslm: it renders prompts with the model's own "
                              "chat template; send raw: true with the full prompt instead.", param=unsupported)
    prompt = body.get("prompt") or ""
    if not isinstance(prompt, str):
        raise bad_request("prompt must be a string.", param="prompt")
    if not prompt and not body.get("context"):
        unload = body.get("keep_alive") in (0, "0", "0s")
        return JSONResponse({"model": model, "created_at": convert.now(), "response": "", "done": True,
                             "done_reason": "unload" if unload else "load"})
    openai_body = _common(state, body)
    context = body.get("context")
    if context is not None and (not isinstance(context, list) or not all(isinstance(t, int) for t in context)):
        raise bad_request("context must be the list of token ids a previous reply returned.", param="context")
    if body.get("images") and (body.get("raw") or context):
        raise bad_request("images with raw or context are not supported: send them through /api/chat, or without "
                          "raw and context.", param="images")
    if body.get("raw") or context:
        # Ollama appends the new (templated) prompt to the earlier conversation's tokens.
        ids = state.tokenizer.encode(prompt, add_special_tokens=False) if body.get("raw") else \
            await state.engine.apply_chat_template(_generate_messages(body, prompt))
        openai_body["prompt"] = (context or []) + list(ids)
        if "max_tokens" not in openai_body:
            openai_body["max_tokens"] = None
        if openai_body.pop("response_format", None) is not None:
            openai_body["structured_outputs"] = {"json": _schema(body.get("format"))}
        openai_body.pop("chat_template_kwargs", None)
        handler, kind = serving_completion.create_completion, "generate"
    else:
        openai_body["messages"] = _generate_messages(body, prompt)
        openai_body["messages"][-1]["content"] = convert.with_images(prompt, body.get("images"), "images")
        handler, kind = serving_chat.create_chat_completion, "generate-chat"
    openai_body["return_token_ids"] = True  # the final line's `context`
    return await _generate(state, request, body, openai_body, handler, kind)


def _generate_messages(body: dict, prompt: str) -> list[dict]:
    system = body.get("system")
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]


def _schema(fmt: Any) -> Any:
    return {"type": "object"} if fmt == "json" else fmt


def _common(state: ServerState, body: dict) -> dict:
    """The OpenAI fields every generating route shares."""
    out: dict[str, Any] = {"model": body["model"], **convert.sampling_fields(body.get("options"),
                                                                             state.max_model_len)}
    fmt = convert.response_format(body.get("format"))
    if fmt is not None:
        out["response_format"] = fmt
    think = body.get("think")
    if think is not None:
        if not isinstance(think, bool):
            raise bad_request("think must be true or false.", param="think")
        out["chat_template_kwargs"] = {"enable_thinking": think}
    if "keep_alive" in body:
        out["keep_alive"] = body["keep_alive"]
    return out


async def _generate(state: ServerState, request: Request, body: dict, openai_body: dict, handler: Handler,
                    kind: str) -> Response:
    stream = body.get("stream", True)  # Ollama streams unless told not to
    if not isinstance(stream, bool):
        raise bad_request("stream must be true or false.", param="stream")
    openai_body["stream"] = stream
    if stream:
        openai_body["stream_options"] = {"include_usage": True}
    started = time.monotonic()
    response = await handler(state, _with_body(request, openai_body))
    if response.status_code >= 400 or not stream:
        if response.status_code >= 400:
            return response
        data = json.loads(response.body)
        return JSONResponse(_final(kind, body["model"], data, data.get("usage"), started, None, full=True))
    return _NDJSONStream(_translate(kind, body["model"], response, started), response)


def _final(kind: str, model: str, data: dict, usage: dict | None, started: float, first: float | None,
           full: bool) -> dict:
    """The last line of a reply (the whole reply when not streamed)."""
    choice = (data.get("choices") or [{}])[0]
    out: dict[str, Any] = {"model": model, "created_at": convert.now()}
    if kind == "chat":
        out["message"] = convert.ollama_message(choice.get("message") or {}) if full else \
            {"role": "assistant", "content": ""}
    else:
        message = choice.get("message") or {}
        out["response"] = (choice.get("text", "") if "text" in choice else message.get("content") or "") \
            if full else ""
        thinking = message.get("reasoning_content")
        if full and thinking:
            out["thinking"] = thinking
    out["done"] = True
    out["done_reason"] = convert.done_reason(choice.get("finish_reason"))
    if kind != "chat":
        prompt_ids = data.get("prompt_token_ids") or choice.get("prompt_token_ids") or []
        out["context"] = list(prompt_ids) + list(choice.get("token_ids") or [])
    out.update(convert.timings(usage, started, first, time.monotonic()))
    return out


async def _translate(kind: str, model: str, response: Any, started: float) -> AsyncIterator[str]:
    """OpenAI's SSE chunks as Ollama's NDJSON lines: one per text delta, tool calls once whole, then the
    final line with the counters."""
    first: float | None = None
    finish: str | None = None
    usage: dict | None = None
    calls: dict[int, dict] = {}
    prompt_ids: list[int] = []
    token_ids: list[int] = []
    buffer = ""
    async for piece in response.body_iterator:
        buffer += piece if isinstance(piece, str) else piece.decode()
        while "\n\n" in buffer:
            event, buffer = buffer.split("\n\n", 1)
            if not event.startswith("data: ") or event == "data: [DONE]":
                continue
            data = json.loads(event[len("data: "):])
            if "error" in data:
                yield _line({"error": convert.error_text(json.dumps(data))})
                return
            usage = data.get("usage") or usage
            prompt_ids = data.get("prompt_token_ids") or prompt_ids
            for choice in data.get("choices") or []:
                if choice.get("index", 0) != 0:
                    continue
                finish = choice.get("finish_reason") or finish
                token_ids += choice.get("token_ids") or []
                prompt_ids = choice.get("prompt_token_ids") or prompt_ids
                text, thinking = _delta_text(choice)
                for call in (choice.get("delta") or {}).get("tool_calls") or []:
                    slot = calls.setdefault(call.get("index", 0), {"name": "", "arguments": ""})
                    fn = call.get("function") or {}
                    slot["name"] += fn.get("name") or ""
                    slot["arguments"] += fn.get("arguments") or ""
                if text or thinking:
                    first = first or time.monotonic()
                    yield _line(_partial(kind, model, text, thinking))
    if calls:
        message = convert.ollama_message({"tool_calls": [{"function": c} for c in calls.values()]})
        yield _line({"model": model, "created_at": convert.now(), "message": message, "done": False})
    final = _final(kind, model, {"choices": [{"finish_reason": finish, "token_ids": token_ids}],
                                 "prompt_token_ids": prompt_ids}, usage, started, first, full=False)
    yield _line(final)


def _delta_text(choice: dict) -> tuple[str, str]:
    if "text" in choice:  # a completion chunk
        return choice.get("text") or "", ""
    delta = choice.get("delta") or {}
    return delta.get("content") or "", delta.get("reasoning_content") or ""


def _partial(kind: str, model: str, text: str, thinking: str) -> dict:
    out: dict[str, Any] = {"model": model, "created_at": convert.now()}
    if kind == "chat":
        out["message"] = {"role": "assistant", "content": text}
        if thinking:
            out["message"]["thinking"] = thinking
    else:
        out["response"] = text
        if thinking:
            out["thinking"] = thinking
    out["done"] = False
    return out


def _line(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


class _NDJSONStream(StreamingResponse):
    """The translated stream; the OpenAI response it reads from is closed with it, which aborts the engine
    requests when the client leaves early."""

    def __init__(self, content: AsyncIterator[str], inner: Any) -> None:
        super().__init__(content, media_type=NDJSON)
        self.inner = inner

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            group = getattr(self.inner, "group", None)
            if group is not None:
                group.abort()


# ---- embeddings ----

async def embed(state: ServerState, request: Request) -> Response:
    body = await _json_body(request)
    model = convert.require_model(body)
    inputs = body.get("input")
    if inputs is None or inputs == [] or inputs == "":
        raise bad_request("input must be a string or a non-empty list of strings.", param="input")
    openai_body: dict[str, Any] = {"model": model, "input": inputs}
    if body.get("dimensions") is not None:
        openai_body["dimensions"] = body["dimensions"]
    if body.get("truncate", True):
        openai_body["truncate_prompt_tokens"] = -1  # Ollama truncates to the context unless told not to
    if "keep_alive" in body:
        openai_body["keep_alive"] = body["keep_alive"]
    started = time.monotonic()
    response = await serving_embedding.create_embedding(state, _with_body(request, openai_body))
    if response.status_code >= 400:
        return response
    data = json.loads(response.body)
    vectors = [d["embedding"] for d in sorted(data["data"], key=lambda d: d["index"])]
    ended = time.monotonic()
    return JSONResponse({"model": model, "embeddings": vectors, "total_duration": int((ended - started) * 1e9),
                         "load_duration": 0, "prompt_eval_count": (data.get("usage") or {}).get("prompt_tokens", 0)})


async def embeddings(state: ServerState, request: Request) -> Response:
    """The older /api/embeddings: one `prompt`, one `embedding`, no truncation."""
    body = await _json_body(request)
    model = convert.require_model(body)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise bad_request("prompt must be a string.", param="prompt")
    openai_body = {"model": model, "input": prompt, **({"keep_alive": body["keep_alive"]}
                                                        if "keep_alive" in body else {})}
    response = await serving_embedding.create_embedding(state, _with_body(request, openai_body))
    if response.status_code >= 400:
        return response
    return JSONResponse({"embedding": json.loads(response.body)["data"][0]["embedding"]})


# ---- models ----

async def tags(state: ServerState, request: Request) -> Response:
    """Every model this server can serve (with a pool: loaded or not), as Ollama lists local models."""
    models = [await _model_entry(name, path) for name, path, _ in _servable(state)]
    return JSONResponse({"models": models})


async def ps(state: ServerState, request: Request) -> Response:
    out = []
    for name, path, entry in _servable(state):
        if entry is not None and entry.state is None:
            continue
        item = await _model_entry(name, path)
        expires = None
        if entry is not None and entry.keep_alive is not None:
            left = entry.last_used + entry.keep_alive - state.model_pool.clock()
            expires = time.time() + max(0.0, left)
        item["expires_at"] = convert.datetime.datetime.fromtimestamp(
            expires if expires is not None else time.time() + 10 * 365 * 86400,
            convert.datetime.timezone.utc).isoformat().replace("+00:00", "Z")
        item["size_vram"] = item["size"] if _on_gpu() else 0
        out.append(item)
    return JSONResponse({"models": out})


def _servable(state: ServerState) -> list[tuple[str, str, Any]]:
    """(name, what is loaded, pool entry or None) for the --model model and every pool model."""
    pool = state.model_pool
    default = pool.default if pool is not None else state
    out = [(n, default.model_path or n, None) for n in default.served_model_names]
    if pool is not None:
        out += [(e.name, e.root or e.model, e) for e in pool.entries.values()]
    return out


def _on_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


async def _model_entry(name: str, path: str) -> dict:
    info = await asyncio.to_thread(_model_info, path)
    details = {
        "parent_model": "",
        "format": "gguf" if info.get("format") == "gguf" else "safetensors",
        "family": info.get("architecture") or "",
        "families": [info["architecture"]] if info.get("architecture") else None,
        "parameter_size": convert.size_label(info.get("num_params")),
        "quantization_level": info.get("quantization") or info.get("dtype") or "",
    }
    return {"name": name, "model": name, "modified_at": info.get("modified_at", convert.now()),
            "size": info.get("size_bytes", 0), "digest": info.get("digest", ""), "details": details}


def _model_info(path: str) -> dict:
    """What the catalog knows of a model (by id or path), plus the file's time and a digest of its name."""
    import hashlib

    from wslm.backend.hub import catalog

    out: dict[str, Any] = {}
    try:
        found = catalog.find_model(path) or _describe_path(path)
    except Exception:  # noqa: BLE001 - a listing shows what it can
        found = None
    if found is not None:
        out.update({k: getattr(found, k, None) for k in ("format", "architecture", "num_params", "quantization",
                                                          "dtype", "size_bytes", "context_length")})
        path = getattr(found, "path", path)
    p = Path(path)
    if p.exists():
        stat = p.stat()
        out["modified_at"] = convert.datetime.datetime.fromtimestamp(
            stat.st_mtime, convert.datetime.timezone.utc).isoformat().replace("+00:00", "Z")
        if not out.get("size_bytes"):
            out["size_bytes"] = stat.st_size if p.is_file() else sum(f.stat().st_size for f in p.rglob("*")
                                                                     if f.is_file())
    # Ollama's digest is the blob's sha256; hashing gigabytes for a listing is not worth it: a stable id.
    out["digest"] = hashlib.sha256(str(p.resolve() if p.exists() else path).encode()).hexdigest()
    return out


def _takes_images(path: str) -> bool:
    """A vision model wslm runs, with its image processor's settings beside it (docs/vision.md)."""
    from wslm.backend.modeling import SUPPORTED_ARCHITECTURES, get_model_class
    from wslm.backend.modeling.vision import has_image_processor

    folder = Path(path)
    try:
        archs = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return False
    return (bool(archs) and archs[0] in SUPPORTED_ARCHITECTURES and has_image_processor(folder)
            and getattr(get_model_class(archs[0]), "takes_images", False))


def _engine_vision(state: ServerState) -> bool:
    """The served engine takes images (a GGUF with its mmproj file, --mmproj or found beside it)."""
    llm = getattr(state.engine, "engine", None)
    return getattr(getattr(llm, "processor", None), "vision", None) is not None


def _describe_path(path: str) -> Any:
    from wslm.backend.hub import catalog

    for info in catalog.list_models():
        if info.path == path or Path(info.path) == Path(path):
            return info
    return None


async def show(state: ServerState, request: Request) -> Response:
    body = await _json_body(request)
    name = convert.require_model(body)
    name = state.check_model(name)
    path = state.model_path or name
    info = await asyncio.to_thread(_model_info, path)
    entry = await _model_entry(name, path)
    arch = info.get("architecture") or "unknown"
    caps = ["embedding"] if state.task == "embed" else ["completion"]
    if state.task != "embed":
        if state.tool_call_parser:
            caps.append("tools")
        if state.reasoning_parser:
            caps.append("thinking")
        if _engine_vision(state) or await asyncio.to_thread(_takes_images, path):
            caps.append("vision")  # apps (Open WebUI, ...) offer image upload by it
    model_info = {"general.architecture": arch, "general.basename": name,
                  "general.parameter_count": info.get("num_params") or 0,
                  f"{arch}.context_length": state.max_model_len}
    template = state.chat_template or getattr(state.tokenizer, "chat_template", None) or ""
    return JSONResponse({
        "license": "", "modelfile": f"# wslm serves this model\nFROM {path}\n", "parameters": "",
        "template": template if isinstance(template, str) else json.dumps(template), "details": entry["details"],
        "model_info": model_info, "capabilities": caps, "modified_at": entry["modified_at"],
    })


async def version(state: ServerState, request: Request) -> Response:
    return JSONResponse({"version": OLLAMA_API_VERSION, "wslm_version": __version__})


async def pull(state: ServerState, request: Request) -> Response:
    """Download through wslm's puller (`wslm models pull`: resumable, mirrors); the name is a Hugging Face
    repo id, with `:QUANT` for one GGUF quant out of many. Progress streams in Ollama's shape."""
    body = await _json_body(request)
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name.strip():
        raise bad_request("model is required: a Hugging Face repo id such as org/repo or org/repo:Q4_K_M.",
                          param="model")
    stream = body.get("stream", True)
    events: asyncio.Queue = asyncio.Queue()
    loop = asyncio.get_running_loop()
    task = loop.run_in_executor(None, _run_pull, name, lambda e: loop.call_soon_threadsafe(events.put_nowait, e))

    async def lines() -> AsyncIterator[str]:
        yield _line({"status": "pulling manifest"})
        while True:
            getter = asyncio.ensure_future(events.get())
            done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                line = _pull_status(getter.result())
                if line is not None:
                    yield _line(line)
                continue
            getter.cancel()
            while not events.empty():
                line = _pull_status(events.get_nowait())
                if line is not None:
                    yield _line(line)
            error = task.result()
            yield _line({"error": error} if error else {"status": "success"})
            return

    if stream is not False:
        return StreamingResponse(lines(), media_type=NDJSON)
    last: dict = {}
    async for line in lines():
        last = json.loads(line)
    if "error" in last:
        return JSONResponse(last, status_code=500 if "disk" in last["error"] else 400)
    return JSONResponse(last)


def _run_pull(name: str, emit: Callable[[dict], None]) -> str | None:
    """The pull, in a worker thread; the error message, or None on success."""
    from wslm.backend.hub.download import Puller, PullError

    try:
        Puller(name, on_event=emit).run()
        return None
    except PullError as exc:
        return str(exc)
    except OSError as exc:
        return f"{exc}. Nothing downloaded is lost; fix it and pull again."


def _pull_status(event: dict) -> dict | None:
    kind = event.get("event")
    if kind == "progress":
        return {"status": f"pulling {event.get('file')}", "digest": event.get("file"),
                "total": event.get("file_total") or 0, "completed": event.get("file_bytes") or 0}
    if kind == "file_done":
        return {"status": f"verifying {event.get('file')}"}
    if kind == "done":
        return {"status": "writing manifest"}
    return None


async def delete(state: ServerState, request: Request) -> Response:
    body = await _json_body(request)
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name:
        raise bad_request("model is required.", param="model")
    name = name[: -len(":latest")] if name.endswith(":latest") else name
    from wslm.backend.hub.catalog import RemoveError, find_model, remove_model

    serving = {n for n, _, e in _servable(state) if e is None or e.state is not None}
    found = await asyncio.to_thread(find_model, name)
    if found is None:
        raise APIError(f"model '{name}' not found", 404)
    if name in serving or found.id in serving:
        raise APIError(f"model '{name}' is being served; unload it (keep_alive 0) or stop the server first.", 409)
    try:
        await asyncio.to_thread(remove_model, name)
    except RemoveError as exc:
        raise APIError(str(exc), 400) from None
    return Response(status_code=200)


async def _not_here(state: ServerState, request: Request) -> Response:
    raise APIError(f"{request.url.path} (building or pushing Ollama models) is not supported by wslm: models "
                   "come from Hugging Face (POST /api/pull, `wslm models pull`) or a .gguf file.", 501)
