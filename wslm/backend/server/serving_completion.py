"""POST /v1/completions (the legacy text API): one or several prompts, strings or token ids, n each."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from wslm.backend.server.async_engine import RequestGroup
from wslm.backend.server.errors import bad_request
from wslm.backend.server.protocol import CompletionRequest, parse_body
from wslm.backend.server.serving_base import (
    ChunkWriter,
    EventStream,
    ServerState,
    Tracker,
    check_max_tokens,
    check_unsupported,
    collect_all,
    completion_logprobs,
    start_group,
    stream_deltas,
)
from wslm.backend.server.structured_request import compile_structured

log = logging.getLogger("wslm.server")


async def create_completion(state: ServerState, request: Request) -> Response:
    req: CompletionRequest = parse_body(await request.body(), CompletionRequest)
    state.apply_generation_defaults(req)
    model = state.check_model(req.model)
    check_unsupported(req.unsupported_fields())
    req.check_stream_options()
    state.check_not_draining()
    check_max_tokens(req.max_tokens, "max_tokens")
    if req.logprobs is not None and req.logprobs < 0:
        raise bad_request(f"logprobs must not be negative, got {req.logprobs}.", param="logprobs")
    params = req.sampling_params(req.max_tokens, req.logprobs)
    await compile_structured(state, params.structured_outputs, req.structured_source)
    prompts_ids: list[list[int]] = []
    prompt_texts: list[str] = []
    for p in req.prompts():
        if isinstance(p, str):
            ids = await state.engine.encode(p)
            if not ids:
                raise bad_request("prompt must not be empty.", param="prompt")
            text = p
        else:
            ids = list(p)
            state.check_token_ids(ids, "prompt")
            text = state.tokenizer.decode(ids) if req.echo else ""
        state.check_request(ids, params, "prompt")
        prompts_ids.append(ids)
        prompt_texts.append(text)

    response_id = f"cmpl-{uuid.uuid4().hex}"
    group = await start_group(state.engine, response_id, prompts_ids, params)
    tracker = state.tracker(len(prompts_ids), params.n, [len(ids) for ids in prompts_ids])
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


def _stream(state: ServerState, group: RequestGroup, tracker: Tracker, response_id: str, created: int,
            model: str, req: CompletionRequest, echo: list[str] | None) -> AsyncIterator[str]:
    n = tracker.n
    head = {"id": response_id, "object": "text_completion", "created": created, "model": model}
    writer = ChunkWriter(head, tracker, req)
    offsets: dict[int, int] = {}  # choice index -> characters sent so far (for logprobs.text_offset)

    def render(d) -> str:
        index = d.prompt * n + d.index
        out = ""
        lp = None
        if req.logprobs is not None and d.token_ids:
            lp = completion_logprobs(state.tokenizer, d.token_ids, d.logprobs or [], req.logprobs, offsets.get(index, 0))
        if d.text or lp is not None:
            out += writer.choice({"index": index, "text": d.text, "logprobs": lp})
        offsets[index] = offsets.get(index, 0) + len(d.text)
        if d.finish_reason is not None:
            out += writer.choice({"index": index, "text": "", "logprobs": None}, d.finish_reason, d.stop_reason)
        return out

    first = ""
    for p, text in enumerate(echo or []):
        for i in range(n):
            offsets[p * n + i] = len(text)
            first += writer.choice({"index": p * n + i, "text": text, "logprobs": None})
    return stream_deltas(group, tracker, writer, response_id, first, render)
