"""POST /v1/completions (the legacy text API): one or several prompts, strings or token ids, n each."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from wslm.backend.entrypoints.openai import serving_beam
from wslm.backend.entrypoints.openai.errors import bad_request
from wslm.backend.entrypoints.openai.protocol import CompletionRequest, parse_body
from wslm.backend.entrypoints.openai.sampling_extras import (
    echo_logprobs,
    join_logprobs,
    prompt_logprobs_json,
)
from wslm.backend.entrypoints.openai.serving_base import (
    ChunkWriter,
    EventStream,
    ServerState,
    Tracker,
    as_bad_request,
    check_max_tokens,
    check_unsupported,
    collect_all,
    completion_logprobs,
    start_group,
    stream_deltas,
)
from wslm.backend.frontend import validation
from wslm.backend.frontend.async_engine import RequestGroup

log = logging.getLogger("wslm.server")


async def create_completion(state: ServerState, request: Request) -> Response:
    req: CompletionRequest = parse_body(await request.body(), CompletionRequest)
    state.apply_generation_defaults(req)
    model = state.check_model(req.model)
    check_unsupported(req.unsupported_fields())
    req.check_stream_options()
    state.check_not_draining()
    check_max_tokens(req.max_tokens, "max_tokens")
    if req.use_beam_search:
        return await _beam_completion(state, request, req, model)
    if req.logprobs is not None and req.logprobs < -1:
        raise bad_request(f"logprobs must be -1 (all) or more, got {req.logprobs}.", param="logprobs")
    req.check_logprob_token_ids(req.logprobs is not None)
    params = req.sampling_params(req.max_tokens, req.logprobs)
    if req.echo and req.logprobs is not None:  # the echoed prompt's tokens carry logprobs too
        params.prompt_logprobs = max(params.prompt_logprobs or 0, req.logprobs)
    prompts = req.prompts()
    with as_bad_request():
        validation.check_batch(len(prompts), params.n, state.limits)
    response_id = f"cmpl-{uuid.uuid4().hex}"
    # The engine's input processor tokenizes, truncates, checks and compiles the grammar (once).
    group, prompts_ids = await start_group(state.engine, response_id, [p if isinstance(p, str) else list(p)
                                                                       for p in prompts], params, what="prompt",
                                           structured_param=req.structured_source or "structured_outputs",
                                           **state.lora_names(model))
    # The echoed prompt: the text as sent, or (token ids, truncation) what the model saw.
    prompt_texts = [p if isinstance(p, str) and req.truncate_prompt_tokens is None else state.tokenizer.decode(ids)
                    for p, ids in zip(prompts, prompts_ids)] if req.echo else []
    tracker = state.tracker(len(prompts_ids), params.n, [len(ids) for ids in prompts_ids])
    created = int(time.time())
    echo = prompt_texts if req.echo else None
    if req.stream:
        return EventStream(_stream(state, group, tracker, response_id, created, model, req, echo, prompts_ids), group)
    results = await collect_all(request, group, tracker)
    if results is None:
        return Response(status_code=499)
    choices = []
    for p in range(len(prompts_ids)):
        prefix = echo[p] if echo else ""
        for i in range(params.n):
            r = results[(p, i)]
            lp = None
            as_ids = req.return_tokens_as_token_ids
            if req.logprobs is not None:
                lp = completion_logprobs(state.tokenizer, r.token_ids, r.logprobs or [], _top_n(req), len(prefix),
                                         as_ids)
                if echo:
                    lp = join_logprobs(echo_logprobs(state.tokenizer, prompts_ids[p], tracker.prompt_logprobs[p],
                                                     req.logprobs, as_ids), lp)
            choice = {
                "index": p * params.n + i,
                "text": prefix + r.text,
                "logprobs": lp,
                "finish_reason": r.finish_reason,
                "stop_reason": r.stop_reason,
            }
            _add_extras(choice, state, req, tracker, p, prompts_ids[p], r.token_ids, first=True)
            choices.append(choice)
    return JSONResponse(tracker.add_metrics({
        "id": response_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": tracker.usage(),
    }))


async def _beam_completion(state: ServerState, request: Request, req: CompletionRequest, model: str) -> Response:
    serving_beam.check_beam_request(req)
    prompts = req.prompts()
    with as_bad_request():
        validation.check_batch(len(prompts), req.n, state.limits)
    ids = [await state.engine.encode(p) if isinstance(p, str) else list(p) for p in prompts]
    params = [serving_beam.beam_params(state, req, req.max_tokens, len(x)) for x in ids]
    response_id = f"cmpl-{uuid.uuid4().hex}"
    results = await serving_beam.search(state, request, response_id, ids, params, model)
    if results is None:
        return Response(status_code=499)
    choices = [{"index": p * req.n + i, "text": beam.text, "logprobs": None, "finish_reason": beam.finish_reason,
                "stop_reason": None} for p, beams in enumerate(results) for i, beam in enumerate(beams)]
    generated = sum(len(beam.token_ids) for beams in results for beam in beams)
    return serving_beam.respond({"id": response_id, "object": "text_completion", "model": model}, choices,
                                sum(len(x) for x in ids), generated, bool(req.stream), None)


def _top_n(req: CompletionRequest) -> int:
    """How many logprobs each generated token reports: all the engine gave for logprob_token_ids."""
    return -1 if req.logprob_token_ids else req.logprobs


def _add_extras(choice: dict, state: ServerState, req: CompletionRequest, tracker: Tracker, p: int,
                prompt_ids: list[int], token_ids: list[int], first: bool) -> None:
    """vLLM's per-choice extras: prompt_logprobs, and prompt/completion token ids when asked for."""
    if req.prompt_logprobs is not None and first:
        choice["prompt_logprobs"] = prompt_logprobs_json(state.tokenizer, tracker.prompt_logprobs[p],
                                                         req.return_tokens_as_token_ids)
    if req.return_token_ids:
        choice["token_ids"] = list(token_ids)
        if first:
            choice["prompt_token_ids"] = prompt_ids


def _stream(state: ServerState, group: RequestGroup, tracker: Tracker, response_id: str, created: int,
            model: str, req: CompletionRequest, echo: list[str] | None,
            prompts_ids: list[list[int]]) -> AsyncIterator[str]:
    n = tracker.n
    head = {"id": response_id, "object": "text_completion", "created": created, "model": model}
    writer = ChunkWriter(head, tracker, req)
    offsets: dict[int, int] = {}  # choice index -> characters sent so far (for logprobs.text_offset)
    as_ids = req.return_tokens_as_token_ids
    # Echo with logprobs waits for the first engine output, which brings the prompt's logprobs.
    late_echo = bool(echo) and req.logprobs is not None
    started: set[int] = set()

    def echo_chunk(p: int, i: int) -> str:
        lp = None
        if late_echo:
            lp = echo_logprobs(state.tokenizer, prompts_ids[p], tracker.prompt_logprobs[p], req.logprobs, as_ids)
        offsets[p * n + i] = len(echo[p])
        return writer.choice({"index": p * n + i, "text": echo[p], "logprobs": lp})

    def render(d) -> str:
        index = d.prompt * n + d.index
        out = echo_chunk(d.prompt, d.index) if late_echo and index not in started else ""
        first = index not in started
        started.add(index)
        lp = None
        if req.logprobs is not None:  # every chunk carries its (maybe empty) logprobs, as vLLM's
            lp = completion_logprobs(state.tokenizer, d.token_ids, d.logprobs or [], _top_n(req),
                                     offsets.get(index, 0), as_ids)
        # One chunk per delta; the last one also carries finish_reason (vLLM's shape: every chunk has its
        # text, token ids and logprobs, so clients can add them up chunk by chunk).
        choice = {"index": index, "text": d.text, "logprobs": lp}
        _add_extras(choice, state, req, tracker, d.prompt, prompts_ids[d.prompt], d.token_ids, first)
        out += writer.choice(choice, d.finish_reason, d.stop_reason)
        offsets[index] = offsets.get(index, 0) + len(d.text)
        return out

    first = ""
    if not late_echo:
        first = "".join(echo_chunk(p, i) for p in range(len(echo or [])) for i in range(n))
    return stream_deltas(group, tracker, writer, response_id, first, render)
