"""`use_beam_search` on /v1/completions and /v1/chat/completions (vLLM's extension): n beams, each step a
group of one-token requests through the engine client, searched by frontend/beam_search.py (the same
search LLM.beam_search runs). The reply comes whole; a streamed one comes as one chunk per choice."""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from wslm.backend.entrypoints.openai.errors import bad_request
from wslm.backend.entrypoints.openai.serving_base import (
    SSE_DONE,
    ClientGone,
    ServerState,
    engine_failure,
    sse,
    start_group,
    until_disconnect,
    usage,
)
from wslm.backend.frontend.async_engine import Aborted, EngineFailure
from wslm.backend.frontend.beam_search import BeamSearch, BeamSearchParams, BeamSearchSequence
from wslm.backend.outputs import RequestOutput, fold_output

# What a beam search request may not combine with: each needs per-token state the search does not keep.
_NOT_WITH_BEAMS = ("logprobs", "top_logprobs", "stop", "stop_token_ids", "response_format", "structured_outputs",
                   "guided_json", "guided_regex", "guided_choice", "guided_grammar", "tools", "logit_bias",
                   "allowed_token_ids", "bad_words", "min_tokens", "prompt_logprobs", "echo")


def check_beam_request(req: Any) -> None:
    for name in _NOT_WITH_BEAMS:
        value = getattr(req, name, None)
        if value not in (None, False, 0, [], {}, ""):
            raise bad_request(f"{name} cannot be combined with use_beam_search: beam search keeps n whole "
                              "sequences, not per-token constraints. Drop one of the two.", param=name)
    if req.n < 1:
        raise bad_request("n (the beam width) must be at least 1.", param="n")


def beam_params(state: ServerState, req: Any, max_tokens: int | None, prompt_len: int) -> BeamSearchParams:
    left = state.max_model_len - prompt_len
    if left < 1:
        raise bad_request(f"The prompt has {prompt_len} tokens; this model's context is {state.max_model_len}.",
                          param="messages" if hasattr(req, "messages") else "prompt")
    return BeamSearchParams(beam_width=req.n, max_tokens=min(max_tokens or left, left),
                            ignore_eos=bool(req.ignore_eos), temperature=req.temperature or 0.0,
                            length_penalty=1.0 if req.length_penalty is None else req.length_penalty,
                            include_stop_str_in_output=bool(req.include_stop_str_in_output))


async def search(state: ServerState, request: Request, response_id: str, prompts: list[list[int]],
                 params: list[BeamSearchParams], model: str | None = None) -> list[list[BeamSearchSequence]] | None:
    """Every prompt's best beams; None when the client left (the caller answers 499). model: the name the
    request gave (a LoRA adapter's runs with it)."""
    eos = set(getattr(state.engine.engine.model_config, "eos_token_ids", None) or [])
    searches = [BeamSearch(ids, p, eos, state.max_model_len) for ids, p in zip(prompts, params)]

    async def run() -> None:
        step = 0
        while live := [s for s in searches if not s.done]:
            batches = [s.step_prompts() for s in live]
            flat = [{"prompt_token_ids": ids} for batch in batches for ids in batch]
            group, _ = await start_group(state.engine, f"{response_id}-{step}", flat, live[0].step_params(),
                                         **state.lora_names(model))
            try:
                results: dict[str, RequestOutput] = {}
                while not group.done:
                    for _tag, item in await group.next_items():
                        if isinstance(item, (EngineFailure, Aborted)):
                            raise item if isinstance(item, EngineFailure) else EngineFailure("aborted")
                        fold_output(results, item)
                outs = [results[rid] for rid in group.request_ids]
            finally:
                group.abort()
            k = 0
            for s, batch in zip(live, batches):
                s.advance(outs[k:k + len(batch)])
                k += len(batch)
            step += 1

    try:
        await until_disconnect(request, run())
    except ClientGone:
        return None
    except EngineFailure as exc:
        raise engine_failure(exc) from exc
    return [s.result(state.tokenizer) for s in searches]


def respond(head: dict, choices: list[dict], prompt_tokens: int, completion_tokens: int, stream: bool,
            delta_key: str | None) -> Response:
    """The whole reply, or (stream) one chunk per choice then usage and [DONE]; delta_key: "delta" for chat
    chunks (the message fields move into it), None for completions."""
    body_usage = usage(prompt_tokens, completion_tokens)
    if not stream:
        return JSONResponse({**head, "created": int(time.time()), "choices": choices, "usage": body_usage})
    chunk_head = {**head, "object": head["object"] + ".chunk" if delta_key else head["object"],
                  "created": int(time.time())}
    out = []
    for c in choices:
        if delta_key:
            c = {"index": c["index"], "delta": c["message"], "logprobs": None, "finish_reason": c["finish_reason"]}
        out.append(sse({**chunk_head, "choices": [c]}))
    out.append(sse({**chunk_head, "choices": [], "usage": body_usage}))
    return StreamingResponse(iter(out + [SSE_DONE]), media_type="text/event-stream")
