"""POST /v1/messages: Anthropic's Messages API (as vLLM serves it), for Claude Code, Cherry Studio and the
`anthropic` client. The request is translated into a chat request and runs the same path as
/v1/chat/completions (one rendering, the same tool and reasoning parsers); the reply comes back as Anthropic
content blocks (text, tool_use, thinking), whole or as Anthropic's SSE events; errors in Anthropic's shape."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal, Union

from pydantic import ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from wslm.backend.entrypoints.openai.chat_reply import ChatReply
from wslm.backend.entrypoints.openai.errors import APIError, bad_request, internal_error
from wslm.backend.entrypoints.openai.protocol import ChatCompletionRequest, _Request, parse_body
from wslm.backend.entrypoints.openai.serving_base import (
    EventStream,
    ServerState,
    Tracker,
    collect_all,
    engine_failure,
)
from wslm.backend.entrypoints.openai.serving_chat import prepare_chat, start_chat
from wslm.backend.frontend.async_engine import EngineFailure, RequestGroup

log = logging.getLogger("wslm.server")

# Anthropic's error types by status code.
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


class AnthropicMessage(_Request):
    role: Literal["user", "assistant"]
    content: Union[str, list[dict[str, Any]]]


class AnthropicTool(_Request):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    input_schema: dict[str, Any]


class MessagesRequest(_Request):
    # Extra fields are kept: vLLM's sampling extras (seed, structured_outputs, chat_template_kwargs, ...) pass
    # on to the chat request, as vLLM's Anthropic endpoint takes them.
    model_config = ConfigDict(extra="allow", protected_namespaces=(), strict=True)

    model: str | None = None
    max_tokens: int
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: Union[str, list[dict[str, Any]], None] = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


class CountTokensRequest(MessagesRequest):
    max_tokens: int = 1  # count_tokens takes no max_tokens


def anthropic_error(exc: APIError) -> JSONResponse:
    kind = _ERROR_TYPES.get(exc.status_code, "api_error")
    return JSONResponse({"type": "error", "error": {"type": kind, "message": exc.message}},
                        status_code=exc.status_code)


async def create_message(state: ServerState, request: Request) -> Response:
    try:
        return await _create_message(state, request)
    except APIError as exc:
        return anthropic_error(exc)
    except Exception as exc:  # noqa: BLE001 - a 500 with a message; the server keeps serving
        log.exception("POST /v1/messages failed")
        return anthropic_error(internal_error(exc))


async def count_tokens(state: ServerState, request: Request) -> Response:
    """POST /v1/messages/count_tokens: the prompt's token count, rendered exactly as /v1/messages renders it."""
    try:
        req: CountTokensRequest = parse_body(await request.body(), CountTokensRequest)
        state.check_model(req.model)
        prompt_ids, _, _ = await prepare_chat(state, chat_request(req), None)
        return JSONResponse({"input_tokens": len(prompt_ids)})
    except APIError as exc:
        return anthropic_error(exc)


async def _create_message(state: ServerState, request: Request) -> Response:
    req: MessagesRequest = parse_body(await request.body(), MessagesRequest)
    model = state.check_model(req.model)
    state.check_not_draining()
    chat = chat_request(req)
    prompt_ids, params, plan = await prepare_chat(state, chat, None)
    message_id = f"msg_{uuid.uuid4().hex}"
    group, prompt_ids = await start_chat(state, message_id, prompt_ids, params, plan, model)
    tracker = state.tracker(1, 1, [len(prompt_ids)])
    if req.stream:
        return EventStream(_stream(group, tracker, message_id, model, plan.new_reply()), group)
    results = await collect_all(request, group, tracker)
    if results is None:
        return Response(status_code=499)
    r = results[(0, 0)]
    reply = plan.new_reply()
    reply.feed(r.text, final=True)
    msg = reply.message()
    content: list[dict] = []
    if msg.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": msg["reasoning_content"], "signature": ""})
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    for call in msg.get("tool_calls") or []:
        content.append({"type": "tool_use", "id": _tool_use_id(call["id"]), "name": call["function"]["name"],
                        "input": _json_object(call["function"]["arguments"])})
    stop_reason, stop_sequence = _stop_reason(reply, r.finish_reason, r.stop_reason)
    usage = tracker.usage()
    return JSONResponse({
        "id": message_id, "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": stop_reason, "stop_sequence": stop_sequence,
        "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]},
    })


def chat_request(req: MessagesRequest) -> ChatCompletionRequest:
    """The chat request that asks for the same thing (a 400 for what cannot be expressed)."""
    messages: list[dict] = []
    if req.system is not None:
        messages.append({"role": "system", "content": _text(req.system, "system")})
    for i, m in enumerate(req.messages):
        messages.extend(_chat_messages(i, m))
    extras = {k: v for k, v in (req.model_extra or {}).items()
              if k in ChatCompletionRequest.model_fields and k not in ("messages", "tools", "tool_choice", "stream")}
    body: dict[str, Any] = {**extras, "messages": messages, "max_tokens": req.max_tokens}
    if messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls"):
        # Anthropic's prefill: a final assistant message is the start of the reply, which continues it.
        body.update(add_generation_prompt=False, continue_final_message=True)
    for name in ("temperature", "top_p", "top_k"):
        if getattr(req, name) is not None:
            body[name] = getattr(req, name)
    if req.stop_sequences:
        body["stop"] = req.stop_sequences
    if req.tools:
        body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                           "parameters": t.input_schema}} for t in req.tools]
    if req.tool_choice is not None:
        body["tool_choice"] = _tool_choice(req.tool_choice)
        if req.tool_choice.get("disable_parallel_tool_use"):
            body["parallel_tool_calls"] = False
    body = {k: v for k, v in body.items() if v is not None}
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValueError as exc:
        raise bad_request(f"Invalid request: {exc}") from None


def _chat_messages(i: int, m: AnthropicMessage) -> list[dict]:
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    out: list[dict] = []
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict] = []
    parts: list[dict] = []  # text and images in order, when the message has an image
    for j, block in enumerate(m.content):
        kind = block.get("type")
        where = f"messages.{i}.content.{j}"
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and m.role == "user":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block.get("source"), where)}})
        elif kind == "tool_use" and m.role == "assistant":
            calls.append({"id": str(block.get("id", "")), "type": "function",
                          "function": {"name": str(block.get("name", "")),
                                       "arguments": json.dumps(block.get("input") or {}, ensure_ascii=False)}})
        elif kind == "tool_result" and m.role == "user":
            out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")),
                        "content": _text(block.get("content") or "", where)})
        elif kind == "thinking" and m.role == "assistant" and isinstance(block.get("thinking"), str):
            thinking.append(block["thinking"])  # the template decides whether to show it (Qwen3: in tool loops)
        elif kind == "redacted_thinking" and m.role == "assistant":
            continue
        else:
            raise bad_request(f"{where}: content blocks of type {kind!r} are not supported in a {m.role} message "
                              "(text, image, tool_use and tool_result blocks are).", param=where)
    has_image = any(p["type"] == "image_url" for p in parts)
    if texts or calls or has_image or not out:
        message: dict[str, Any] = {"role": m.role, "content": parts if has_image else "\n".join(texts)}
        if calls:
            message["tool_calls"] = calls
        if thinking:
            message["reasoning_content"] = "\n".join(thinking)
        out.append(message)
    return out


def _image_url(source: Any, where: str) -> str:
    """An Anthropic image block's source as a URL: base64 data as a data: URL, or the url source's URL."""
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64" and isinstance(source.get("data"), str):
        return f"data:{source.get('media_type') or 'image/png'};base64,{source['data']}"
    if kind == "url" and isinstance(source.get("url"), str):
        return source["url"]
    raise bad_request(f'{where}.source must be {{"type": "base64", "media_type": "image/png", "data": ...}} or '
                      '{"type": "url", "url": ...}.', param=f"{where}.source")


def _text(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, dict) and b.get("type") == "text"
                                       and isinstance(b.get("text"), str) for b in value):
        return "\n".join(b["text"] for b in value)
    raise bad_request(f"{where} must be a string or a list of text blocks.", param=where)


def _tool_choice(choice: dict) -> Any:
    kind = choice.get("type")
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad_request('tool_choice must be {"type": "auto"}, {"type": "any"}, {"type": "none"} or '
                      '{"type": "tool", "name": ...}.', param="tool_choice")


def _tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _json_object(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return partial_json_object(text)  # a call cut short by max_tokens; its stop_reason says so


def partial_json_object(text: str) -> dict:
    """What can be read of a JSON object cut short (a tool call that max_tokens ended): its complete members,
    and a string or number at the end kept as far as it goes (as Anthropic's SDKs read partial input JSON);
    a key without its value, or a literal cut short (`tru`), is left out. {} when nothing is readable."""
    stack: list[str] = []  # the open containers: "{" or "["
    cuts: list[tuple[int, str]] = []  # (end of a prefix, the closers it needs), latest last
    in_string = escaped = False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
                cuts.append((i + 1, _closers(stack)))
            continue
        if ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append(ch)
            cuts.append((i + 1, _closers(stack)))
        elif ch in "}]":
            if stack:
                stack.pop()
            cuts.append((i + 1, _closers(stack)))
        elif ch == ",":
            cuts.append((i, _closers(stack)))  # before the comma: what came before it is whole
        elif ch not in " \t\r\n:":
            cuts.append((i + 1, _closers(stack)))  # a number or literal so far (kept only if it parses)
    candidates = [(text[:-1] if escaped else text) + '"' + _closers(stack)] if in_string else []
    candidates += [text[:end] + closers for end, closers in reversed(cuts)]
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}


def _closers(stack: list[str]) -> str:
    return "".join("}" if c == "{" else "]" for c in reversed(stack))


def _stop_reason(reply: ChatReply, finish: str | None, stop: Any) -> tuple[str, str | None]:
    if reply.called_tools and finish == "stop":
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    if finish == "stop" and isinstance(stop, str):
        return "stop_sequence", stop
    return "end_turn", None


def _event(name: str, data: dict) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


class _Blocks:
    """The content blocks of a streamed message: opens a block when the kind of output changes."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None

    def _open(self, kind: str, block: dict) -> str:
        out = self.close()
        self.index += 1
        self.kind = kind
        return out + _event("content_block_start", {"type": "content_block_start", "index": self.index,
                                                    "content_block": block})

    def close(self) -> str:
        if self.kind is None:
            return ""
        self.kind = None
        return _event("content_block_stop", {"type": "content_block_stop", "index": self.index})

    def _delta(self, delta: dict) -> str:
        return _event("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def piece(self, piece: dict) -> str:
        out = ""
        if piece.get("reasoning_content"):
            if self.kind != "thinking":
                out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out += self._delta({"type": "thinking_delta", "thinking": piece["reasoning_content"]})
        if piece.get("content"):
            if self.kind != "text":
                out += self._open("text", {"type": "text", "text": ""})
            out += self._delta({"type": "text_delta", "text": piece["content"]})
        for call in piece.get("tool_calls") or []:
            if call.get("id"):
                out += self._open("tool_use", {"type": "tool_use", "id": _tool_use_id(call["id"]),
                                               "name": call["function"]["name"], "input": {}})
            if call["function"].get("arguments"):
                out += self._delta({"type": "input_json_delta", "partial_json": call["function"]["arguments"]})
        return out


async def _stream(group: RequestGroup, tracker: Tracker, message_id: str, model: str, reply: ChatReply
                  ) -> AsyncIterator[str]:
    blocks = _Blocks()
    finish: str | None = None
    stop: Any = None
    try:
        yield _event("message_start", {"type": "message_start", "message": {
            "id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": tracker.prompt_tokens[0], "output_tokens": 0}}})
        while not group.done:
            try:
                deltas = tracker.fold(await group.next_items())
            except EngineFailure as exc:
                error = engine_failure(exc)
                yield _event("error", {"type": "error", "error": {"type": _ERROR_TYPES.get(error.status_code,
                                                                                           "api_error"),
                                                                  "message": error.message}})
                return
            out = ""
            for d in deltas:
                if d.finish_reason is not None:
                    finish, stop = d.finish_reason, d.stop_reason
                for piece in reply.feed(d.text, final=d.finish_reason is not None):
                    out += blocks.piece(piece)
            if out:
                yield out
        if finish is None:
            yield "".join(blocks.piece(p) for p in reply.feed("", final=True))
        stop_reason, stop_sequence = _stop_reason(reply, finish, stop)
        yield blocks.close() + _event("message_delta", {
            "type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": {"input_tokens": tracker.prompt_tokens[0], "output_tokens": tracker.completion_tokens}})
        yield _event("message_stop", {"type": "message_stop"})
    except Exception as exc:  # noqa: BLE001 - headers are sent: report in-band
        log.exception("streaming %s failed", message_id)
        yield _event("error", {"type": "error", "error": {"type": "api_error", "message": internal_error(exc).message}})
    finally:
        group.abort()
