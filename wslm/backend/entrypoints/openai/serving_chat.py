"""POST /v1/chat/completions, streamed (SSE, chunk by chunk as OpenAI sends them) or whole."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from wslm.backend.entrypoints.openai import serving_beam
from wslm.backend.entrypoints.openai.errors import bad_request
from wslm.backend.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage, parse_body
from wslm.backend.entrypoints.openai.sampling_extras import (
    ChatStreamExtras,
    chat_response_extras,
)
from wslm.backend.entrypoints.openai.serving_base import (
    ChunkWriter,
    EventStream,
    ServerState,
    Tracker,
    as_bad_request,
    chat_logprobs,
    check_max_tokens,
    check_unsupported,
    collect_all,
    start_group,
    stream_deltas,
)
from wslm.backend.entrypoints.openai.serving_tools import ChatPlan, plan_chat
from wslm.backend.frontend import validation
from wslm.backend.frontend.async_engine import RequestGroup
from wslm.backend.sampling_params import SamplingParams

log = logging.getLogger("wslm.server")


def template_messages(messages: list[ChatMessage]) -> list[dict]:
    """The request's messages as plain dicts; chat.normalize_messages (inside the engine's rendering, the same
    for LLM.chat) checks and shapes them for the template."""
    return [m.model_dump(exclude_none=True) for m in messages]


async def render_prompt(state: ServerState, messages: list[dict], **kwargs: Any) -> list[int]:
    """The prompt ids for a chat, rendered by the engine (through the async client, off the event loop);
    a template that fails on the user's messages or template is a 400 naming why."""
    try:
        return await state.engine.apply_chat_template(messages, **kwargs)
    except ValueError as exc:
        raise bad_request(str(exc), param=getattr(exc, "param", None) or "messages",
                          code=getattr(exc, "code", None)) from exc
    except Exception as exc:  # noqa: BLE001 - a Jinja error from the user's messages or template is theirs
        raise bad_request(f"The chat template could not render these messages: {type(exc).__name__}: {exc}",
                          param="messages") from exc


async def prepare_chat(state: ServerState, req: ChatCompletionRequest, top_n: int | None
                       ) -> tuple[list[int], SamplingParams, ChatPlan]:
    """The prompt ids, sampling params and reply plan (tools, reasoning) of a chat request: the path
    /v1/chat/completions and /v1/messages share; every problem is a 400."""
    max_tokens = req.requested_max_tokens()
    check_max_tokens(max_tokens, "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens")
    params = req.sampling_params(max_tokens, top_n)
    plan = plan_chat(state, req)
    if plan.keep_special_tokens:
        params.skip_special_tokens = False  # the tool-call markers are special tokens (vLLM does the same)
    prompt_ids = await render_prompt(state, template_messages(req.messages), chat_template=req.chat_template,
                                     add_generation_prompt=req.add_generation_prompt,
                                     continue_final_message=req.continue_final_message,
                                     tools=plan.template_tools, chat_template_kwargs=req.chat_template_kwargs)
    plan.prompt_rendered(state.tokenizer, prompt_ids)  # its last tokens: what truncation keeps
    # tool_choice's grammar (a tool's parameters schema is then at fault when it fails), or the client's.
    spec, plan.structured_param = (plan.grammar, "tools") if plan.grammar is not None else (
        params.structured_outputs, req.structured_source)
    if spec is not None:
        try:
            params.structured_outputs = await asyncio.to_thread(plan.after_reasoning, spec)  # builds a grammar
        except ValueError as exc:  # the constraint as it was given is at fault: name where it came from
            raise bad_request(str(exc), param=plan.structured_param or "structured_outputs",
                              code="invalid_structured_output") from exc
    return prompt_ids, params, plan


async def start_chat(state: ServerState, response_id: str, prompt_ids: list[int], params: SamplingParams,
                     plan: ChatPlan, model: str | None = None) -> tuple[RequestGroup, list[int]]:
    """Queue a prepared chat: the engine's input processor truncates, checks and compiles its grammar
    (once, for LLM.chat and the server alike); every problem is a 400 naming the field. Returns the group
    and the prompt ids as the engine runs them."""
    group, prompts = await start_group(state.engine, response_id, [prompt_ids], params, what="messages",
                                       structured_param=plan.structured_param or "structured_outputs",
                                       **state.lora_names(model))
    return group, prompts[0]


async def create_chat_completion(state: ServerState, request: Request) -> Response:
    req: ChatCompletionRequest = parse_body(await request.body(), ChatCompletionRequest)
    state.apply_generation_defaults(req)
    model = state.check_model(req.model)
    check_unsupported(req.unsupported_fields())
    req.check_stream_options()
    state.check_not_draining()
    if req.use_beam_search:
        return await _beam_chat(state, request, req, model)
    top_n = req.requested_logprobs()
    prompt_ids, params, plan = await prepare_chat(state, req, top_n)

    response_id = f"chatcmpl-{uuid.uuid4().hex}"
    group, prompt_ids = await start_chat(state, response_id, prompt_ids, params, plan, model)
    tracker = state.tracker(1, params.n, [len(prompt_ids)])
    created = int(time.time())
    if req.stream:
        extras = ChatStreamExtras(req, tracker, prompt_ids, state.tokenizer)
        return EventStream(_stream(state, group, tracker, response_id, created, model, req, top_n, plan, extras),
                           group)
    results = await collect_all(request, group, tracker)
    if results is None:
        return Response(status_code=499)
    choices = []
    for i in range(params.n):
        r = results[(0, i)]
        reply = plan.new_reply()
        reply.feed(r.text, final=True)
        choices.append({
            "index": i,
            "message": {**_message(plan, reply, r.finish_reason), "role": reply_role(state, req)},
            "logprobs": {"content": chat_logprobs(state.tokenizer, r.token_ids, r.logprobs or [], _top_n(req, top_n),
                                                  req.return_tokens_as_token_ids)}
            if top_n is not None else None,
            "finish_reason": _finish_reason(plan, reply, r.finish_reason),
            "stop_reason": r.stop_reason,
        })
    body = {
        "id": response_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": tracker.usage(),
    }
    tracker.add_metrics(body)
    token_ids = [results[(0, i)].token_ids for i in range(params.n)]
    return JSONResponse(chat_response_extras(body, req, tracker, prompt_ids, state.tokenizer, token_ids))


async def _beam_chat(state: ServerState, request: Request, req: ChatCompletionRequest, model: str) -> Response:
    serving_beam.check_beam_request(req)
    with as_bad_request():
        validation.check_batch(1, req.n, state.limits)
    prompt_ids, _, _ = await prepare_chat(state, req, None)
    if getattr(prompt_ids, "images", None):
        raise bad_request("use_beam_search does not take images yet: send the request without it.",
                          param="use_beam_search")
    params = serving_beam.beam_params(state, req, req.requested_max_tokens(), len(prompt_ids))
    response_id = f"chatcmpl-{uuid.uuid4().hex}"
    results = await serving_beam.search(state, request, response_id, [prompt_ids], [params], model)
    if results is None:
        return Response(status_code=499)
    role = reply_role(state, req)
    choices = [{"index": i, "message": {"role": role, "content": beam.text}, "logprobs": None,
                "finish_reason": beam.finish_reason, "stop_reason": None} for i, beam in enumerate(results[0])]
    return serving_beam.respond({"id": response_id, "object": "chat.completion", "model": model}, choices,
                                len(prompt_ids), sum(len(b.token_ids) for b in results[0]), bool(req.stream), "delta")


def _top_n(req: ChatCompletionRequest, top_n: int | None) -> int | None:
    """The top_logprobs each token reports: with logprob_token_ids, every id asked for (and the sampled one)."""
    return -1 if req.logprob_token_ids and top_n is not None else top_n


def _message(plan: ChatPlan, reply: Any, engine_finish: str | None) -> dict:
    """A whole reply's message. A forced tool call (tool_choice "required" or named) has content "" (vLLM's);
    one that max_tokens cut is no call at all: no tool_calls, finish_reason "length" (as OpenAI and vLLM)."""
    msg = reply.message()
    if "reasoning_content" in msg:  # vLLM's field since 0.10 beside the older name clients still read
        msg["reasoning"] = msg["reasoning_content"]
    if plan.grammar is None:
        return msg
    if engine_finish == "length":
        msg.pop("tool_calls", None)
        return {**msg, "content": ""}
    return {**msg, "content": msg.get("content") or ""}


def _finish_reason(plan: ChatPlan, reply: Any, engine_finish: str | None) -> str | None:
    """OpenAI's: "tool_calls" after calls the model chose (auto, required), "stop" after a named function."""
    finish = reply.finish_reason(engine_finish)
    return "stop" if finish == "tool_calls" and plan.named else finish


def reply_role(state: ServerState, req: ChatCompletionRequest) -> str:
    """--response-role; without a generation prompt the reply continues the last message, so its role (vLLM)."""
    if not req.add_generation_prompt and req.messages:
        last = req.messages[-1]
        role = last.get("role") if isinstance(last, dict) else getattr(last, "role", None)
        if isinstance(role, str):
            return role
    return state.response_role


def _stream(state: ServerState, group: RequestGroup, tracker: Tracker, response_id: str, created: int,
            model: str, req: ChatCompletionRequest, top_n: int | None, plan: ChatPlan,
            extras: ChatStreamExtras) -> AsyncIterator[str]:
    head = {"id": response_id, "object": "chat.completion.chunk", "created": created, "model": model}
    writer = ChunkWriter(head, tracker, req)
    replies = [plan.new_reply() for _ in range(tracker.n)]

    def render(d) -> str:
        out = ""
        lp = None
        if top_n is not None and d.token_ids:
            lp = {"content": chat_logprobs(state.tokenizer, d.token_ids, d.logprobs or [], _top_n(req, top_n),
                                           req.return_tokens_as_token_ids)}
        reply = replies[d.index]
        deltas = reply.feed(d.text, final=d.finish_reason is not None)
        if (lp is not None or (d.token_ids and req.return_token_ids)) and not deltas:
            deltas = [{"content": ""}]
        ids = d.token_ids
        # finish_reason rides on the step's last chunk (vLLM's shape: with continuous usage, every chunk that
        # carries a choice adds tokens); an empty delta carries it only when the step produced nothing else.
        finish = _finish_reason(plan, reply, d.finish_reason) if d.finish_reason is not None else None
        for k, delta in enumerate(deltas):
            last = k == len(deltas) - 1
            out += writer.choice(extras.content_chunk({"index": d.index, "delta": delta, "logprobs": lp}, ids),
                                 finish if last else None, d.stop_reason)
            lp, ids = None, []  # the token logprobs and ids ride on the first chunk of this step
        if finish is not None and not deltas:
            out += writer.choice({"index": d.index, "delta": {}, "logprobs": None}, finish, d.stop_reason)
        return out

    # The first delta of each choice carries the role, as OpenAI's do.
    role = reply_role(state, req)
    first = "".join(writer.choice({"index": i, "delta": {"role": role, "content": ""}, "logprobs": None},
                                  top=extras.first_chunk_fields() if i == 0 else None)
                    for i in range(tracker.n))
    return stream_deltas(group, tracker, writer, response_id, first, render)
