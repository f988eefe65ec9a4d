"""POST /v1/completions (the legacy text API): one or several prompts, strings or token ids, n each."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from wslm.backend.server.async_engine import EngineFailure, RequestGroup
from wslm.backend.server.errors import APIError, bad_request, internal_error
from wslm.backend.server.protocol import CompletionRequest, parse_body
from wslm.backend.server.serving_base import (
    SSE_DONE,
    EventStream,
    ServerState,
    Tracker,
    check_max_tokens,
    check_unsupported,
    collect_all,
    completion_logprobs,
    sse,
    start_group,
)

log = logging.getLogger("wslm.server")


async def create_completion(state: ServerState, request: Request) -> Response:
    req: CompletionRequest = parse_body(await request.body(), CompletionRequest)
    model = state.check_model(req.model)
    check_unsupported(req.unsupported_fields())
    req.check_stream_options()
    state.check_not_draining()
    check_max_tokens(req.max_tokens, "max_tokens")
    if req.logprobs is not None and not 0 <= req.logprobs <= 20:
        raise bad_request(f"logprobs must be in [0, 20], got {req.logprobs}.", param="logprobs")
    prompts_ids: list[list[int]] = []
    prompt_texts: list[str] = []
    for p in req.prompts():
        if isinstance(p, str):
            ids = list(state.tokenizer.encode(p))
            if not ids:
                raise bad_request("prompt must not be empty.", param="prompt")
            text = p
        else:
            ids = list(p)
            state.check_token_ids(ids, "prompt")
            text = state.tokenizer.decode(ids) if req.echo else ""
        state.check_length(len(ids), req.max_tokens, "prompt")
        prompts_ids.append(ids)
        prompt_texts.append(text)
    params = req.sampling_params(req.max_tokens, req.logprobs)

    response_id = f"cmpl-{uuid.uuid4().hex}"
    group = await start_group(state.engine, response_id, prompts_ids, params)
    tracker = Tracker(len(prompts_ids), params.n, [len(ids) for ids in prompts_ids])
    created = int(time.time())
    echo = prompt_texts if req.echo else None
    if req.stream:
        return EventStream(_stream(state, group, tracker, response_id, created, model, req, echo), group)
    results = await collect_all(request, group, tracker)
    if results is None:
        return Response(status_code=499)
    choices = []
    for p in range(len(prompts_ids)):
        prefix = echo[p] if echo else ""
        for i in range(params.n):
            r = results[(p, i)]
            lp = None
            if req.logprobs is not None:
                lp = completion_logprobs(state.tokenizer, r.token_ids, r.logprobs or [], req.logprobs, len(prefix))
            choices.append({
                "index": p * params.n + i,
                "text": prefix + r.text,
                "logprobs": lp,
                "finish_reason": r.finish_reason,
                "stop_reason": r.stop_reason,
            })
    return JSONResponse({
        "id": response_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": tracker.usage(),
    })


async def _stream(state: ServerState, group: RequestGroup, tracker: Tracker, response_id: str, created: int,
                  model: str, req: CompletionRequest, echo: list[str] | None) -> AsyncIterator[str]:
    include_usage = req.include_usage
    continuous = include_usage and bool(req.stream_options and req.stream_options.continuous_usage_stats)
    n = tracker.n
    head = {"id": response_id, "object": "text_completion", "created": created, "model": model}
    offsets: dict[int, int] = {}  # choice index -> characters sent so far (for logprobs.text_offset)

    def chunk(index: int, text: str, logprobs: Any = None, finish: str | None = None, stop: Any = None) -> str:
        choice: dict[str, Any] = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = stop
        body = {**head, "choices": [choice]}
        if include_usage:  # as OpenAI: null on every chunk but the last (running totals if asked)
            body["usage"] = tracker.usage() if continuous else None
        return sse(body)

    try:
        if echo:
            first = []
            for p, text in enumerate(echo):
                for i in range(n):
                    offsets[p * n + i] = len(text)
                    first.append(chunk(p * n + i, text))
            yield "".join(first)
        while not group.done:
            try:
                deltas = tracker.fold(await group.next_items())
            except EngineFailure as exc:
                log.error("request %s failed: %s", response_id, exc)
                yield sse(APIError(str(exc), 500, type="server_error").body()) + SSE_DONE
                return
            out = []
            for d in deltas:
                index = d.prompt * n + d.index
                lp = None
                if req.logprobs is not None and d.token_ids:
                    lp = completion_logprobs(state.tokenizer, d.token_ids, d.logprobs or [], req.logprobs,
                                             offsets.get(index, 0))
                if d.text or lp is not None:
                    out.append(chunk(index, d.text, lp))
                offsets[index] = offsets.get(index, 0) + len(d.text)
                if d.finish_reason is not None:
                    out.append(chunk(index, "", None, d.finish_reason, d.stop_reason))
            if out:
                yield "".join(out)
        if include_usage:
            yield sse({**head, "choices": [], "usage": tracker.usage()})
        yield SSE_DONE
    except Exception as exc:  # noqa: BLE001 - headers are sent: report in-band, as vLLM does
        log.exception("streaming %s failed", response_id)
        yield sse(internal_error(exc).body()) + SSE_DONE
    finally:
        group.abort()
