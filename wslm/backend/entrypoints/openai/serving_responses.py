"""POST /v1/responses: OpenAI's Responses API (as vLLM serves it), for `client.responses.create`, Codex-style
tools and the openai-agents SDK. The request's `instructions`, `input` items and stored conversation
(`previous_response_id`) become chat messages and run the same path as /v1/chat/completions (one rendering,
one validation, the same tool and reasoning parsers); the reply comes back as Responses output items
(message, function_call, reasoning), whole or as Responses' SSE events. Responses made with `store` (the
default) are kept in memory, the last --max-stored-responses of them, for GET, cancel, DELETE and
previous_response_id."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Union

from pydantic import ConfigDict
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from wslm.backend.entrypoints.openai.chat_reply import ChatReply
from wslm.backend.entrypoints.openai.errors import APIError, bad_request, internal_error
from wslm.backend.entrypoints.openai.protocol import ChatCompletionRequest, _Request, parse_body
from wslm.backend.entrypoints.openai.serving_base import (
    EventStream,
    ServerState,
    Tracker,
    check_unsupported,
    collect_all,
    engine_failure,
)
from wslm.backend.entrypoints.openai.serving_chat import prepare_chat, start_chat
from wslm.backend.frontend.async_engine import Aborted, EngineFailure, RequestGroup

log = logging.getLogger("wslm.server")

class ResponsesRequest(_Request):
    # Extra fields are kept: vLLM's sampling extras (seed, top_k, structured_outputs, chat_template_kwargs, ...)
    # pass on to the chat request, as vLLM's Responses endpoint takes them.
    model_config = ConfigDict(extra="allow", protected_namespaces=(), strict=True)

    model: str | None = None
    input: Union[str, list[Any]] = ""
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool | None = True
    stream: bool | None = False
    background: bool | None = False
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[Any] | None = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: bool | None = True
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    # Known but not supported: refused with a 400 when set.
    truncation: str | None = None
    include: list[str] | None = None
    top_logprobs: int | None = None
    conversation: Any = None
    prompt: Any = None

    def unsupported_fields(self) -> list[tuple[str, str]]:
        found = []
        if self.background:
            found.append(("background", "background responses are not supported; send the request in the "
                                        "foreground (stream=true to follow it as it is written)"))
        if self.truncation not in (None, "disabled"):
            found.append(("truncation", 'only truncation "disabled" is supported: a prompt longer than the '
                                        "context is a 400, never cut silently"))
        if "message.output_text.logprobs" in (self.include or ()) or self.top_logprobs:
            found.append(("top_logprobs" if self.top_logprobs else "include",
                          "logprobs are not returned by /v1/responses; use /v1/chat/completions with logprobs"))
        if self.conversation is not None:
            found.append(("conversation", "the Conversations API is not served; continue a conversation with "
                                          "previous_response_id"))
        if self.prompt is not None:
            found.append(("prompt", "stored prompt templates are not supported; send `instructions` and `input`"))
        return found


# ---- the store ------------------------------------------------------------------------------------------


@dataclass
class StoredResponse:
    body: dict  # the response object as GET returns it
    messages: list[dict]  # this turn's input as chat messages (its instructions are not carried on, as OpenAI's)
    previous: str | None  # previous_response_id: the conversation before this turn
    reply: list[dict] = field(default_factory=list)  # what the model answered, as chat messages
    group: RequestGroup | None = None  # while it runs: what cancel aborts


class ResponseStore:
    """The last `max_entries` stored responses, in memory (least recently used out first). Each keeps only its
    own turn; a conversation is the chain of previous_response_id links, so storage grows with the turns,
    not with the square of them. A chain whose older turn was evicted cannot be continued (a 404 says so)."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, response_id: str, entry: StoredResponse) -> None:
        if self.max_entries <= 0:
            return
        self.entries[response_id] = entry
        self.entries.move_to_end(response_id)
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self.entries.get(response_id)
        if entry is not None:
            self.entries.move_to_end(response_id)
        return entry

    def pop(self, response_id: str) -> StoredResponse | None:
        return self.entries.pop(response_id, None)

    def history(self, response_id: str) -> list[dict]:
        """The chat messages of the conversation up to and including this response (404 naming the missing
        turn; 400 while one still runs)."""
        turns: list[StoredResponse] = []
        ids: list[str] = []
        rid: str | None = response_id
        while rid is not None:
            entry = self.entries.get(rid)
            if entry is None:
                raise _not_found(rid, "previous_response_id", self.max_entries,
                                 "" if rid == response_id else f" (an earlier turn of {response_id!r})")
            if entry.body.get("status") in ("in_progress", "queued"):
                raise bad_request(f"Response {rid!r} is still in progress; continue the conversation once it "
                                  "has finished.", param="previous_response_id")
            turns.append(entry)
            ids.append(rid)
            rid = entry.previous
            if len(turns) > len(self.entries):  # a cycle cannot be built through the API; never loop anyway
                break
        for rid in reversed(ids):  # used now, oldest turn first: the store's order stays the conversation's
            self.entries.move_to_end(rid)
        return [m for entry in reversed(turns) for m in entry.messages + entry.reply]


def store_of(state: ServerState) -> ResponseStore:
    if state.responses is None:
        state.responses = ResponseStore(state.max_stored_responses)
    return state.responses


def _not_found(response_id: str, param: str | None, max_entries: int, where: str = "") -> APIError:
    why = ("this server stores no responses (--max-stored-responses 0)" if max_entries <= 0 else
           f"this server keeps the last {max_entries} responses made with store=true in memory "
           "(--max-stored-responses), until it restarts")
    return APIError(f"No response with id {response_id!r}{where} is stored: {why}.", 404, param=param,
                    code="response_not_found")


# ---- input -> chat messages -----------------------------------------------------------------------------

_ROLES = ("user", "assistant", "system", "developer")
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


def input_messages(req: ResponsesRequest) -> list[dict]:
    """The request's `input` as chat messages; an item that cannot be expressed is a 400 naming it."""
    if isinstance(req.input, str):
        return [{"role": "user", "content": req.input}] if req.input else []
    messages: list[dict] = []
    reasoning: list[str] = []  # a reasoning item goes with the assistant turn that follows it
    last_assistant: dict | None = None  # function_call items join the assistant message they follow
    for i, item in enumerate(req.input):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object (a message, function_call or function_call_output "
                              "item).", param=where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise bad_request(f"{where}.role must be one of {', '.join(_ROLES)}, got {role!r}.",
                                  param=f"{where}.role")
            message: dict[str, Any] = {"role": role, "content": _content(item.get("content"), f"{where}.content",
                                                                         images=True)}
            if role == "assistant" and reasoning:
                message["reasoning_content"] = "\n".join(reasoning)
                reasoning = []
            messages.append(message)
            last_assistant = message if role == "assistant" else None
        elif kind == "function_call":
            call_id, name, arguments = (item.get(k) for k in ("call_id", "name", "arguments"))
            for key, value in (("call_id", call_id), ("name", name), ("arguments", arguments)):
                if not isinstance(value, str):
                    raise bad_request(f"{where}.{key} must be a string.", param=f"{where}.{key}")
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            if last_assistant is None:
                last_assistant = {"role": "assistant", "content": None}
                if reasoning:
                    last_assistant["reasoning_content"] = "\n".join(reasoning)
                    reasoning = []
                messages.append(last_assistant)
            last_assistant.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise bad_request(f"{where}.call_id must be a string.", param=f"{where}.call_id")
            messages.append({"role": "tool", "tool_call_id": call_id,
                             "content": _content(item.get("output"), f"{where}.output")})
            last_assistant = None
        elif kind == "reasoning":
            text = _reasoning_text(item)
            if text:
                reasoning.append(text)
        else:
            raise bad_request(f"{where}: input items of type {kind!r} are not supported (wslm serves text models: "
                              "message, function_call, function_call_output and reasoning items).",
                              param=f"{where}.type")
    return messages


def _reasoning_text(item: dict) -> str:
    """A reasoning item's text: its full reasoning_text content when it has it, else its summary."""
    for key in ("content", "summary"):
        parts = item.get(key)
        if isinstance(parts, list):
            text = "\n".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
            if text:
                return text
    return ""


def _content(value: Any, where: str, images: bool = False) -> str | list[dict]:
    """A message's text; with input_image parts (a message's, images=True) the parts as chat content parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        parts: list[dict] = []
        for j, part in enumerate(value):
            if isinstance(part, dict) and part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str):
                texts.append(part["text"])
                parts.append({"type": "text", "text": part["text"]})
            elif images and isinstance(part, dict) and part.get("type") == "input_image":
                if not isinstance(part.get("image_url"), str):
                    raise bad_request(f"{where}[{j}]: an input_image needs an image_url (a data: or http(s) URL); "
                                      "file_id images are not supported.", param=f"{where}[{j}]")
                parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
            elif isinstance(part, dict) and part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
                texts.append(part["refusal"])
                parts.append({"type": "text", "text": part["refusal"]})
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad_request(f"{where}[{j}]: content parts of type {kind!r} are not supported (input_text, "
                                  "output_text and input_image parts are).", param=f"{where}[{j}]")
        if any(p["type"] == "image_url" for p in parts):
            return parts
        return "\n".join(texts)
    raise bad_request(f"{where} must be a string or a list of input_text parts.", param=where)


def _tools(tools: list[Any] | None) -> list[dict] | None:
    """Responses' flat function tools as chat tools; other tool types (web search, file search, ...) are a 400."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise bad_request(f"{where}: tools of type {kind!r} are not supported: wslm runs no built-in tools; "
                              'declare function tools ({"type": "function", "name": ..., "parameters": {...}}) '
                              "and run them yourself.", param=f"{where}.type")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise bad_request(f"{where}.name must be a non-empty string.", param=f"{where}.name")
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice is None or isinstance(choice, str):
        return choice  # "none", "auto", "required": the chat path checks them
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad_request('tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...} (wslm '
                      f"runs no built-in tools), got {json.dumps(choice)[:200]}.", param="tool_choice")


def _response_format(text: dict | None) -> dict | None:
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise bad_request("text.format must be an object such as {\"type\": \"json_schema\", \"name\": ..., "
                          "\"schema\": {...}}.", param="text.format")
    kind = fmt.get("type")
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise bad_request('text.format of type "json_schema" needs a `schema` object.', param="text.format.schema")
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict", "description")
                                                       if k in fmt}}
    raise bad_request(f'text.format.type must be "text", "json_object" or "json_schema", got {kind!r}.',
                      param="text.format.type")


# Request fields the chat path names in its errors, as this API calls them.
_PARAMS = {"messages": "input", "max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
           "response_format": "text.format"}


def _as_responses_error(exc: APIError) -> APIError:
    param = _PARAMS.get(exc.param or "", exc.param)
    message = exc.message
    if exc.param in ("max_tokens", "max_completion_tokens"):
        message = message.replace(exc.param, "max_output_tokens")
    if exc.code == "context_length_exceeded":
        message = message.replace("the messages", "the input")
    if param != exc.param or message != exc.message:
        return APIError(message, exc.status_code, param=param, code=exc.code, type=exc.type)
    return exc


def chat_request(state: ServerState, req: ResponsesRequest, history: list[dict], turn: list[dict]
                 ) -> ChatCompletionRequest:
    """The chat request that asks for the same thing (a 400 for what cannot be expressed)."""
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + history + turn
    if not messages:
        raise bad_request("input must not be empty: send a string or a list of input items.", param="input")
    extras = {k: v for k, v in (req.model_extra or {}).items()
              if k in ChatCompletionRequest.model_fields and k not in (
                  "messages", "tools", "tool_choice", "stream", "stream_options", "max_tokens",
                  "max_completion_tokens", "response_format", "n", "logprobs", "top_logprobs")}
    body: dict[str, Any] = {**extras, "messages": messages, "max_tokens": req.max_output_tokens,
                            "temperature": req.temperature, "top_p": req.top_p, "tools": _tools(req.tools),
                            "tool_choice": _tool_choice(req.tool_choice),
                            "parallel_tool_calls": req.parallel_tool_calls,
                            "response_format": _response_format(req.text)}
    effort = (req.reasoning or {}).get("effort")
    if effort is not None and state.reasoning_parser:  # e.g. gpt-oss's template reads reasoning_effort
        body["chat_template_kwargs"] = {"reasoning_effort": effort, **(body.get("chat_template_kwargs") or {})}
    body = {k: v for k, v in body.items() if v is not None}
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValueError as exc:
        raise bad_request(f"Invalid request: {exc}") from None


# ---- handlers -------------------------------------------------------------------------------------------


async def create_response(state: ServerState, request: Request) -> Response:
    req: ResponsesRequest = parse_body(await request.body(), ResponsesRequest)
    model = state.check_model(req.model)
    check_unsupported(req.unsupported_fields())
    if req.max_output_tokens is not None and req.max_output_tokens < 1:
        raise bad_request(f"max_output_tokens must be at least 1, got {req.max_output_tokens}.",
                          param="max_output_tokens")
    state.check_not_draining()
    store = store_of(state)
    history = store.history(req.previous_response_id) if req.previous_response_id else []
    turn = input_messages(req)
    chat = chat_request(state, req, history, turn)
    state.apply_generation_defaults(chat)
    try:
        prompt_ids, params, plan = await prepare_chat(state, chat, None)
        response_id = f"resp_{uuid.uuid4().hex}"
        group, prompt_ids = await start_chat(state, response_id, prompt_ids, params, plan, model)
    except APIError as exc:
        raise _as_responses_error(exc) from None
    tracker = state.tracker(1, 1, [len(prompt_ids)])
    stored = bool(req.store) and store.max_entries > 0
    body = _response_body(response_id, model, req, chat, stored)
    entry = StoredResponse(body, turn, req.previous_response_id, group=group) if stored else None
    output = _Output(plan.new_reply(), summary=bool((req.reasoning or {}).get("summary")))
    if req.stream:
        return EventStream(_stream(state, store, entry, group, tracker, body, output), group)
    if entry is not None:
        store.put(response_id, entry)
    try:
        results = await collect_all(request, group, tracker)
    except APIError as exc:
        _finish(state, store, entry, body, output, tracker, "failed", error=exc)
        raise
    r = results[(0, 0)] if results is not None else None
    output.feed(r.text if r is not None else "", True)
    finish = r.finish_reason if r is not None else "abort"
    _finish(state, store, entry, body, output, tracker, finish)
    if results is None:
        return Response(status_code=499)
    return JSONResponse(body)


async def get_response(state: ServerState, request: Request) -> Response:
    store = store_of(state)
    response_id = request.path_params["response_id"]
    entry = store.get(response_id)
    if entry is None:
        raise _not_found(response_id, None, store.max_entries)
    return JSONResponse(entry.body)


async def cancel_response(state: ServerState, request: Request) -> Response:
    """Stop a response that is still being written (its stream or request ends with status "cancelled")."""
    store = store_of(state)
    response_id = request.path_params["response_id"]
    entry = store.get(response_id)
    if entry is None:
        raise _not_found(response_id, None, store.max_entries)
    status = entry.body.get("status")
    if status not in ("in_progress", "queued", "cancelled"):
        raise bad_request(f"Response {response_id!r} is {status}: only a response still in progress can be "
                          "cancelled.", code="response_not_cancellable")
    _cancel(entry)
    return JSONResponse(entry.body)


async def delete_response(state: ServerState, request: Request) -> Response:
    store = store_of(state)
    response_id = request.path_params["response_id"]
    entry = store.pop(response_id)
    if entry is None:
        raise _not_found(response_id, None, store.max_entries)
    _cancel(entry)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


def _cancel(entry: StoredResponse) -> None:
    group = entry.group
    if group is not None and not group.done:
        group.abort()
        group.queue.put_nowait((0, Aborted("cancelled")))  # wakes whoever waits on it: its reply ends now
    if entry.body.get("status") in ("in_progress", "queued"):
        entry.body["status"] = "cancelled"


# ---- output ---------------------------------------------------------------------------------------------


def _response_body(response_id: str, model: str, req: ResponsesRequest, chat: ChatCompletionRequest,
                   stored: bool) -> dict:
    """The response object, in progress: the final one fills in status, output and usage."""
    text = dict(req.text or {})
    text.setdefault("format", {"type": "text"})
    return {
        "id": response_id, "object": "response", "created_at": int(time.time()), "status": "in_progress",
        "background": False, "error": None, "incomplete_details": None, "instructions": req.instructions,
        "completed_at": None, "max_output_tokens": req.max_output_tokens, "max_tool_calls": None, "model": model,
        "output": [],
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": None, "summary": None, **(req.reasoning or {})},
        "store": stored, "temperature": chat.temperature, "text": text,
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": list(req.tools or []), "top_p": chat.top_p, "truncation": "disabled", "usage": None,
        "user": req.user, "metadata": req.metadata or {},
    }


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class _Output:
    """The output items of one reply, built as the reply is parsed (reasoning, then message text, then function
    calls; a new item whenever the kind of output changes), and the stream events that build them the way
    OpenAI's clients accumulate them. A non-streamed reply is fed whole and its events are dropped."""

    def __init__(self, reply: ChatReply, summary: bool) -> None:
        self.reply = reply
        self.summary = summary  # reasoning.summary asked for: the reasoning is also given as its summary
        self.items: list[dict] = []
        self.open: dict | None = None  # the item being written
        self.seq = 0

    def event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"

    def _at(self, item: dict) -> dict:
        return {"item_id": item["id"], "output_index": len(self.items) - 1}

    def _start(self, item: dict, part: dict | None = None) -> str:
        out = self.close()
        self.items.append(item)
        self.open = item
        out += self.event("response.output_item.added", output_index=len(self.items) - 1,
                          item={**item, "content": []} if part is not None else dict(item))
        if part is not None:
            out += self.event("response.content_part.added", **self._at(item), content_index=0, part=dict(part))
        return out

    def feed(self, text: str, final: bool) -> str:
        out = ""
        for piece in self.reply.feed(text, final):
            if piece.get("reasoning_content"):
                if self.open is None or self.open["type"] != "reasoning":
                    part = {"type": "reasoning_text", "text": ""}
                    out += self._start({"id": _id("rs"), "type": "reasoning", "summary": [], "content": [part],
                                        "status": "in_progress"}, part)
                self.open["content"][0]["text"] += piece["reasoning_content"]
                out += self.event("response.reasoning_text.delta", **self._at(self.open), content_index=0,
                                  delta=piece["reasoning_content"])
            if piece.get("content"):
                if self.open is None or self.open["type"] != "message":
                    out += self._start_message()
                self.open["content"][0]["text"] += piece["content"]
                out += self.event("response.output_text.delta", **self._at(self.open), content_index=0,
                                  delta=piece["content"], logprobs=[])
            for call in piece.get("tool_calls") or []:
                fn = call.get("function") or {}
                if call.get("id"):
                    out += self._start({"id": _id("fc"), "type": "function_call", "call_id": call["id"],
                                        "name": fn.get("name", ""), "arguments": "", "status": "in_progress"})
                if fn.get("arguments") and self.open is not None and self.open["type"] == "function_call":
                    self.open["arguments"] += fn["arguments"]
                    out += self.event("response.function_call_arguments.delta", **self._at(self.open),
                                      delta=fn["arguments"])
        return out

    def _start_message(self) -> str:
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return self._start({"id": _id("msg"), "type": "message", "role": "assistant", "status": "in_progress",
                            "content": [part]}, part)

    def close(self, status: str = "completed") -> str:
        item, self.open = self.open, None
        if item is None:
            return ""
        at = {"item_id": item["id"], "output_index": self.items.index(item)}
        item["status"] = status
        out = ""
        if item["type"] == "message":
            part = item["content"][0]
            out += self.event("response.output_text.done", **at, content_index=0, text=part["text"], logprobs=[])
            out += self.event("response.content_part.done", **at, content_index=0, part=part)
        elif item["type"] == "reasoning":
            part = item["content"][0]
            out += self.event("response.reasoning_text.done", **at, content_index=0, text=part["text"])
            out += self.event("response.content_part.done", **at, content_index=0, part=part)
            if self.summary:
                summary = {"type": "summary_text", "text": part["text"]}
                item["summary"] = [summary]
                out += self.event("response.reasoning_summary_part.added", **at, summary_index=0,
                                  part={"type": "summary_text", "text": ""})
                out += self.event("response.reasoning_summary_text.delta", **at, summary_index=0,
                                  delta=part["text"])
                out += self.event("response.reasoning_summary_text.done", **at, summary_index=0, text=part["text"])
                out += self.event("response.reasoning_summary_part.done", **at, summary_index=0, part=summary)
        elif item["type"] == "function_call":
            out += self.event("response.function_call_arguments.done", **at, arguments=item["arguments"],
                              name=item["name"])
        return out + self.event("response.output_item.done", output_index=at["output_index"], item=item)

    def finish(self, status: str) -> str:
        """Close what is open (an empty message when the reply had no output at all, as OpenAI always answers
        with one); status: the items' final status."""
        out = "" if self.items or self.open else self._start_message()
        out += self.close(status)
        return out

    def chat_messages(self) -> list[dict]:
        """The reply as the chat message a later turn (previous_response_id) shows the model."""
        msg = self.reply.message()
        return [{k: v for k, v in msg.items() if v is not None}]

    def reasoning_tokens(self, tokenizer: Any) -> int:
        text = "".join(i["content"][0]["text"] for i in self.items if i["type"] == "reasoning")
        if not text:
            return 0
        try:
            return len(tokenizer.encode(text, add_special_tokens=False))
        except Exception:  # noqa: BLE001 - a count for usage only
            return 0


def _status(finish: str | None) -> str:
    if finish == "length":
        return "incomplete"
    if finish in ("abort", "cancelled"):
        return "cancelled"
    return "completed"


def _finish(state: ServerState, store: ResponseStore, entry: StoredResponse | None, body: dict, output: _Output,
            tracker: Tracker, finish: str | None, error: APIError | None = None) -> str:
    """Fill in the final response object (and its stored copy); returns the closing stream events."""
    status = "failed" if error is not None else _status(finish)
    if entry is not None and entry.body.get("status") == "cancelled":
        status = "cancelled"
    events = output.finish("completed" if status == "completed" else "incomplete")
    body["status"] = status
    body["output"] = output.items
    if status == "completed":
        body["completed_at"] = int(time.time())
    if status == "incomplete":
        body["incomplete_details"] = {"reason": "max_output_tokens"}
    if error is not None:
        body["error"] = {"code": error.code or error.type, "message": error.message}
    prompt = tracker.prompt_tokens[0]
    body["usage"] = {
        "input_tokens": prompt, "input_tokens_details": {"cached_tokens": tracker.cached_tokens[0]},
        "output_tokens": tracker.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": output.reasoning_tokens(state.tokenizer)},
        "total_tokens": prompt + tracker.completion_tokens,
    }
    tracker.add_metrics(body)
    if entry is not None:
        entry.body = body
        entry.reply = output.chat_messages()
        entry.group = None
    return events


async def _stream(state: ServerState, store: ResponseStore, entry: StoredResponse | None, group: RequestGroup,
                  tracker: Tracker, body: dict, output: _Output) -> AsyncIterator[str]:
    finish: str | None = None
    ended = False
    try:
        if entry is not None:  # stored once the stream runs: a client gone before it started leaves nothing
            store.put(body["id"], entry)
        yield output.event("response.created", response=body) + output.event("response.in_progress", response=body)
        while not group.done:
            try:
                deltas = tracker.fold(await group.next_items())
            except EngineFailure as exc:
                error = engine_failure(exc)
                out = output.event("error", code=error.code or error.type, message=error.message, param=None)
                out += _finish(state, store, entry, body, output, tracker, None, error=error)
                ended = True
                yield out + output.event("response.failed", response=body)
                return
            out = ""
            for d in deltas:
                if d.finish_reason is not None:
                    finish = d.finish_reason
                out += output.feed(d.text, final=d.finish_reason is not None)
            if out:
                yield out
        if finish is None:
            output.feed("", final=True)
        out = _finish(state, store, entry, body, output, tracker, finish)
        ended = True
        kind = "response.completed" if body["status"] == "completed" else "response.incomplete"
        yield out + output.event(kind, response=body)
    except Exception as exc:  # noqa: BLE001 - headers are sent: report in-band
        log.exception("streaming %s failed", body["id"])
        error = internal_error(exc)
        if not ended:
            _finish(state, store, entry, body, output, tracker, None, error=error)
        yield output.event("error", code="server_error", message=error.message, param=None)
    finally:
        group.abort()
        if not ended and entry is not None and entry.body.get("status") == "in_progress":
            entry.body["status"] = "cancelled"  # the client went away: nothing more will be written
            entry.group = None
