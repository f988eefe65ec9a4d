"""POST /v1/chat/completions, streamed (SSE, chunk by chunk as OpenAI sends them) or whole."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from wslm.backend.server.async_engine import RequestGroup
from wslm.backend.server.errors import bad_request
from wslm.backend.server.protocol import ChatCompletionRequest, ChatMessage, parse_body
from wslm.backend.server.serving_base import (
    ChunkWriter,
    EventStream,
    ServerState,
    Tracker,
    chat_logprobs,
    check_max_tokens,
    check_unsupported,
    collect_all,
    start_group,
    stream_deltas,
)
from wslm.backend.server.structured_request import compile_structured

log = logging.getLogger("wslm.server")

_ROLES = {"system", "user", "assistant", "developer"}


def template_messages(messages: list[ChatMessage]) -> list[dict]:
    """OpenAI messages as the chat template wants them: text content only."""
    out = []
    for i, m in enumerate(messages):
        if m.role in ("tool", "function") or m.tool_calls:
            raise bad_request(f"messages[{i}]: tool calls and tool messages are not supported by wslm yet.",
                              param=f"messages.{i}", code="unsupported_parameter")
        if m.role not in _ROLES:
            raise bad_request(f"messages[{i}].role must be one of system, user, assistant, developer; "
                              f"got {m.role!r}.", param=f"messages.{i}.role")
        if isinstance(m.content, list):
            texts = []
            for part in m.content:
                if part.type not in ("text", "input_text"):
                    raise bad_request(f"messages[{i}]: content parts of type {part.type!r} are not supported: "
                                      "wslm serves text-only models. Send text parts.",
                                      param=f"messages.{i}.content", code="unsupported_parameter")
                texts.append(part.text or "")
            content = "\n".join(texts)
        else:
            content = m.content or ""
        if m.content is None and m.role != "assistant":
            raise bad_request(f"messages[{i}].content is required for role {m.role!r}.",
                              param=f"messages.{i}.content")
        message: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": content}
        if m.name:
            message["name"] = m.name
        out.append(message)
    return out


async def render_prompt(state: ServerState, messages: list[dict], **kwargs: Any) -> list[int]:
    """The prompt ids for a chat, rendered by the engine (through the async client, off the event loop);
    a template that fails on the user's messages or template is a 400 naming why."""
    try:
        return await state.engine.apply_chat_template(messages, **kwargs)
    except ValueError as exc:
        raise bad_request(str(exc), param="messages") from exc
    except Exception as exc:  # noqa: BLE001 - a Jinja error from the user's messages or template is theirs
        raise bad_request(f"The chat template could not render these messages: {type(exc).__name__}: {exc}",
                          param="messages") from exc


async def create_chat_completion(state: ServerState, request: Request) -> Response:
    req: ChatCompletionRequest = parse_body(await request.body(), ChatCompletionRequest)
    state.apply_generation_defaults(req)
    model = state.check_model(req.model)
    check_unsupported(req.unsupported_fields())
    req.check_stream_options()
    state.check_not_draining()
    max_tokens = req.requested_max_tokens()
    check_max_tokens(max_tokens, "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens")
    top_n = req.requested_logprobs()
    messages = template_messages(req.messages)
    prompt_ids = await render_prompt(state, messages, chat_template=req.chat_template,
                                     add_generation_prompt=req.add_generation_prompt)
    params = req.sampling_params(max_tokens, top_n)
    await compile_structured(state, params.structured_outputs, req.structured_source)
    state.check_request(prompt_ids, params, "messages")

    response_id = f"chatcmpl-{uuid.uuid4().hex}"
    group = await start_group(state.engine, response_id, [prompt_ids], params)
    tracker = state.tracker(1, params.n, [len(prompt_ids)])
    created = int(time.time())
    if req.stream:
        return EventStream(_stream(state, group, tracker, response_id, created, model, req, top_n), group)
    results = await collect_all(request, group, tracker)
    if results is None:
        return Response(status_code=499)
    choices = []
    for i in range(params.n):
        r = results[(0, i)]
        choices.append({
            "index": i,
            "message": {"role": "assistant", "content": r.text},
            "logprobs": {"content": chat_logprobs(state.tokenizer, r.token_ids, r.logprobs or [], top_n)}
            if top_n is not None else None,
            "finish_reason": r.finish_reason,
            "stop_reason": r.stop_reason,
        })
    return JSONResponse({
        "id": response_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": tracker.usage(),
    })


def _stream(state: ServerState, group: RequestGroup, tracker: Tracker, response_id: str, created: int,
            model: str, req: ChatCompletionRequest, top_n: int | None) -> AsyncIterator[str]:
    head = {"id": response_id, "object": "chat.completion.chunk", "created": created, "model": model}
    writer = ChunkWriter(head, tracker, req)

    def render(d) -> str:
        out = ""
        lp = None
        if top_n is not None and d.token_ids:
            lp = {"content": chat_logprobs(state.tokenizer, d.token_ids, d.logprobs or [], top_n)}
        if d.text or lp is not None:
            out += writer.choice({"index": d.index, "delta": {"content": d.text}, "logprobs": lp})
        if d.finish_reason is not None:
            out += writer.choice({"index": d.index, "delta": {}, "logprobs": None}, d.finish_reason, d.stop_reason)
        return out

    # The first delta of each choice carries the role, as OpenAI's do.
    first = "".join(writer.choice({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None})
                    for i in range(tracker.n))
    return stream_deltas(group, tracker, writer, response_id, first, render)
