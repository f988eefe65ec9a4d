"""What the chat and completion handlers share: the model check, the context-length check, logprobs and
usage in OpenAI's shape, SSE framing, and waiting for a result while watching for the client leaving."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from wslm.backend.entrypoints.openai.errors import APIError, bad_request, internal_error
from wslm.backend.entrypoints.openai.http_limits import HTTPLimits
from wslm.backend.entrypoints.openai.request_metrics import RequestTiming
from wslm.backend.errors import ErrorKind
from wslm.backend.frontend import validation
from wslm.backend.frontend.async_engine import Aborted, AsyncEngine, EngineFailure, RequestGroup
from wslm.backend.frontend.metrics import ServerMetrics
from wslm.backend.frontend.validation import RequestLimits
from wslm.backend.outputs import Logprob, fold_completion


@dataclass
class ServerState:
    """Everything the handlers need, built once by the launcher (or a test)."""

    engine: AsyncEngine
    tokenizer: Any
    served_model_names: list[str]
    max_model_len: int
    model_path: str = ""
    api_key: str | None = None
    metrics: ServerMetrics | None = None
    aliases: set[str] = field(default_factory=set)  # other accepted names (the resolved model id/path)
    vocab_size: int | None = None  # the model's (may exceed len(tokenizer))
    limits: RequestLimits | None = None  # None: from max_model_len and vocab_size (a stand-in engine)
    http_limits: HTTPLimits = field(default_factory=HTTPLimits)
    allowed_origins: list[str] | None = None  # browser origins besides loopback ones (["*"]: any)
    allowed_hosts: list[str] | None = None  # Host names besides loopback ones, when bound to loopback
    bound_host: str | None = None  # the address listened on (loopback: the Host header is checked)
    cors: tuple = (["*"], ["*"], False)  # --allowed-methods, --allowed-headers, --allow-credentials
    # vLLM's serving flags (cli/serve.py's "vLLM flags").
    enable_prompt_tokens_details: bool = False  # usage.prompt_tokens_details only when asked, as vLLM
    enable_force_include_usage: bool = False  # usage on streams even without stream_options.include_usage
    enable_per_request_metrics: bool = False  # vLLM's `metrics` object (request_metrics.py) on answers
    enable_server_load_tracking: bool = False  # GET /load counts requests in flight
    enable_tokenizer_info_endpoint: bool = False
    return_tokens_as_token_ids: bool = False  # logprob tokens as "token_id:N" unless a request says otherwise
    default_sampling: dict[str, Any] = field(default_factory=dict)  # --generation-config: request defaults
    chat_template: str | None = None  # the template in use (GET /tokenizer_info shows it)
    server_load: int = 0  # requests in flight (with --enable-server-load-tracking)
    # Tool calling and reasoning (serving_tools.py): parser names, chosen by flag or from the chat template.
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    exclude_tools_when_tool_choice_none: bool = False
    task: str = "generate"  # what the model serves: "generate" (chat, completions) or "embed" (embeddings)
    response_role: str = "assistant"  # --response-role: the role of chat replies
    # With an API key on a non-loopback address (and no --public-utility-endpoints), the key guards /tokenize,
    # /metrics, /docs, ... too (app.py's UTILITY_PATHS).
    guard_utility_endpoints: bool = False
    # /v1/responses (serving_responses.py): how many stored responses are kept (--max-stored-responses), and
    # the store itself, made on first use.
    max_stored_responses: int = 1000
    responses: Any = None

    # --model-pool (model_pool.ModelPool): more models behind this port, loaded on request; None: this one only.
    model_pool: Any = None
    # --enable-lora (serving_lora.LoraRegistry): adapters served by name over this model; None: none.
    lora: Any = None

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    def check_model(self, requested: str | None) -> str:
        """The name to answer with; 404 (as OpenAI and vLLM) for a model this server does not serve."""
        if requested is None or requested == "" or requested in self.served_model_names:
            return requested or self.model_name
        if requested in self.aliases:
            return self.model_name
        if self.lora is not None and requested in self.lora:
            return requested
        names = self.model_pool.names() if self.model_pool is not None else self.served_model_names
        names = [*names, *(self.lora.adapters if self.lora is not None else ())]
        served = ", ".join(f"`{n}`" for n in names)
        raise APIError(
            f"The model `{requested}` does not exist. This server serves {served} (see GET /v1/models).",
            404,
            param="model",
            code="model_not_found",
        )

    def lora_names(self, model: str | None) -> dict[str, Any]:
        """start_group's lora_request= when `model` names an adapter (serving_lora.py); else nothing."""
        req = self.lora.get(model) if self.lora is not None else None
        return {} if req is None else {"lora_request": req}

    def check_not_draining(self) -> None:
        if self.engine.draining:
            raise APIError("The server is shutting down and takes no new requests.", 503)
        if not self.engine.alive:
            raise APIError(f"The engine loop is not running ({self.engine.dead or 'not started'}); restart "
                           "`wslm serve` (its log on stderr says what stopped it).", 503)

    def tracker(self, num_prompts: int, n: int, prompt_lens: list[int]) -> Tracker:
        """A Tracker for one request, reporting usage the way this server's flags ask."""
        return Tracker(num_prompts, n, prompt_lens, prompt_tokens_details=self.enable_prompt_tokens_details,
                       force_usage=self.enable_force_include_usage, timing=self.enable_per_request_metrics)

    def apply_generation_defaults(self, req: Any) -> None:
        """--generation-config: the model's recommended sampling values fill the fields a request left unset
        (as vLLM's default_sampling_params); anything the client sent wins. So does the server's
        --return-tokens-as-token-ids."""
        if getattr(req, "return_tokens_as_token_ids", False) is None:
            req.return_tokens_as_token_ids = self.return_tokens_as_token_ids
        sent = req.model_fields_set
        for name, value in self.default_sampling.items():
            if name == "max_tokens":
                if ({"max_tokens", "max_completion_tokens"} & sent) or getattr(req, "max_tokens", 0) is not None:
                    continue  # completions default to 16 tokens, as OpenAI's; only chat takes max_new_tokens
            elif name not in type(req).model_fields or name in sent:
                continue
            setattr(req, name, value)

    def __post_init__(self) -> None:
        if self.limits is None:
            self.limits = RequestLimits(self.max_model_len, self.vocab_size or len(self.tokenizer))

    def check_length(self, prompt_len: int, max_tokens: int | None, what: str) -> None:
        with as_bad_request():
            validation.check_length(prompt_len, max_tokens, self.max_model_len, what)

    def check_token_ids(self, ids: list[int], param: str) -> None:
        with as_bad_request():
            validation.check_token_ids(ids, self.limits.vocab_size, param)



@contextmanager
def as_bad_request() -> Iterator[None]:
    """validation.py's RequestError (or any ValueError) as a 400 carrying its param and code."""
    try:
        yield
    except ValueError as exc:
        raise bad_request(str(exc), param=getattr(exc, "param", None), code=getattr(exc, "code", None)) from exc


def check_unsupported(found: list[tuple[str, str]]) -> None:
    if found:
        param, why = found[0]
        raise bad_request(f"{why}. Remove `{param}` from the request.", param=param, code="unsupported_parameter")


def check_max_tokens(value: int | None, param: str) -> None:
    if value is not None and value < 1:
        raise bad_request(f"{param} must be at least 1, got {value}.", param=param)


class EventStream(StreamingResponse):
    """An SSE response that aborts its engine requests however it ends: a generator that never started
    (the client left before the first byte) would otherwise never run its own clean-up."""

    def __init__(self, content: Any, group: Any) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.group = group

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.group.abort()


def sse(obj: dict) -> str:
    return "data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n\n"


SSE_DONE = "data: [DONE]\n\n"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict:
    """OpenAI's usage object; prompt_tokens_details (prefix-cache hits) only with
    --enable-prompt-tokens-details, as vLLM (null otherwise)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens} if cached_tokens is not None else None,
    }


def _lp(value: float) -> float:
    # JSON has no -inf; vLLM clamps the same way.
    return max(value, -9999.0) if not math.isnan(value) else -9999.0


def token_text(tokenizer: Any, token_id: int, entry: Logprob | None, as_ids: bool = False) -> str:
    if as_ids:  # vLLM's return_tokens_as_token_ids: "token_id:123", unambiguous for any byte-level token
        return f"token_id:{token_id}"
    if entry is not None and entry.decoded_token:
        return entry.decoded_token
    return tokenizer.decode([token_id])


def chat_logprobs(tokenizer: Any, token_ids: list[int], logprobs: list[dict[int, Logprob]], top_n: int,
                  as_ids: bool = False) -> list:
    """The `logprobs.content` entries of a chat choice."""
    content = []
    for token_id, entries in zip(token_ids, logprobs, strict=False):
        sampled = entries.get(token_id)
        text = token_text(tokenizer, token_id, sampled, as_ids)
        top = []
        if top_n:  # -1: every entry (the whole vocabulary was asked for)
            for tid, e in sorted(entries.items(), key=lambda kv: kv[1].rank)[: top_n if top_n > 0 else None]:
                t = token_text(tokenizer, tid, e, as_ids)
                top.append({"token": t, "logprob": _lp(e.logprob), "bytes": list(t.encode("utf-8"))})
        content.append({
            "token": text,
            "logprob": _lp(sampled.logprob) if sampled is not None else -9999.0,
            "bytes": list(text.encode("utf-8")),
            "top_logprobs": top,
        })
    return content


def completion_logprobs(tokenizer: Any, token_ids: list[int], logprobs: list[dict[int, Logprob]], top_n: int,
                        offset: int, as_ids: bool = False) -> dict:
    """The legacy completions `logprobs` object; offset is where this text starts in the choice's text."""
    out: dict[str, list] = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    for token_id, entries in zip(token_ids, logprobs, strict=False):
        sampled = entries.get(token_id)
        text = token_text(tokenizer, token_id, sampled, as_ids)
        out["tokens"].append(text)
        out["token_logprobs"].append(_lp(sampled.logprob) if sampled is not None else -9999.0)
        out["text_offset"].append(offset)
        offset += len(text)
        # The sampled token first (as vLLM: clients read the first key as the token), then the top ones.
        top = {text: out["token_logprobs"][-1]} if sampled is not None else {}
        for tid, e in sorted(entries.items(), key=lambda kv: kv[1].rank):
            if tid != token_id and (top_n < 0 or e.rank <= top_n):
                top[token_text(tokenizer, tid, e, as_ids)] = _lp(e.logprob)
        out["top_logprobs"].append(top)
    return out


def engine_failure(exc: EngineFailure) -> APIError:
    """The engine failed the request: 503 when it ran out of memory (retry later, or smaller), else 500."""
    if exc.kind is ErrorKind.OUT_OF_MEMORY:
        return APIError(str(exc), 503, type="server_error", code="out_of_memory")
    if exc.kind is ErrorKind.ENGINE_DEAD:
        return APIError(str(exc), 503, type="server_error", code="engine_dead")
    return APIError(str(exc), 500, type="server_error")


class ClientGone(Exception):
    """The client closed the connection before a non-streamed answer was ready."""


async def until_disconnect(request: Request, work: Awaitable[Any]) -> Any:
    """Await work, but give up (ClientGone) if the client disconnects first: its request must be aborted."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        watcher.cancel()
        raise
    if task in done:
        watcher.cancel()
        return task.result()
    task.cancel()
    raise ClientGone()


@dataclass
class Delta:
    """What one choice gained in one batch of engine outputs (CompletionOutput's fields, plus its prompt);
    outputs.fold_completion adds them up."""

    prompt: int  # which prompt (tag) it belongs to
    index: int  # the completion index within that prompt
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


class Tracker:
    """Follows the choices of a RequestGroup: folds engine deltas into per-choice Deltas, keeps the usage
    counts, and marks choices finished (engine finish, server abort) so that every choice finishes once."""

    def __init__(self, num_prompts: int, n: int, prompt_lens: list[int], prompt_tokens_details: bool = False,
                 force_usage: bool = False, timing: bool = False) -> None:
        self.n = n
        # Per-request metrics describe one generation stream: none for n > 1 or several prompts (as vLLM).
        self.timing = RequestTiming() if timing and n == 1 and num_prompts == 1 else None
        self.timing_asked = timing
        self.prompt_tokens_details = prompt_tokens_details
        self.force_usage = force_usage
        self.prompt_tokens = list(prompt_lens)
        self.cached_tokens = [0] * num_prompts
        self.completion_tokens = 0
        self.unfinished = {(p, i) for p in range(num_prompts) for i in range(n)}
        self.prompt_logprobs: list[list | None] = [None] * num_prompts  # per prompt, when asked for

    def fold(self, items: list[tuple[int, Any]]) -> list[Delta]:
        """Deltas (merged per choice, in arrival order) for a batch from RequestGroup.next_items();
        raises EngineFailure if the engine failed the request."""
        merged: dict[tuple[int, int], Delta] = {}
        for tag, item in items:
            if isinstance(item, EngineFailure):
                raise item
            if isinstance(item, Aborted):
                for p, i in sorted(k for k in self.unfinished if k[0] == tag):
                    d = merged.setdefault((p, i), Delta(p, i))
                    d.finish_reason = item.reason
                    self.unfinished.discard((p, i))
                continue
            if item.error and all(c.finish_reason == "error" for c in item.outputs):
                raise EngineFailure(item.error, item.error_kind or ErrorKind.ENGINE)
            if item.prompt_token_ids:
                self.prompt_tokens[tag] = len(item.prompt_token_ids)
            self.cached_tokens[tag] = item.num_cached_tokens or 0
            if item.prompt_logprobs is not None:
                self.prompt_logprobs[tag] = item.prompt_logprobs
            if self.timing is not None:
                self.timing.observe(item, sum(len(c.token_ids) for c in item.outputs))
            for c in item.outputs:
                if (tag, c.index) not in self.unfinished:
                    continue
                if c.finish_reason == "error":
                    raise EngineFailure(item.error or "The engine failed while generating this completion.",
                                        item.error_kind or ErrorKind.ENGINE)
                fold_completion(merged.setdefault((tag, c.index), Delta(tag, c.index)), c)
                self.completion_tokens += len(c.token_ids)
                if c.finish_reason is not None:
                    self.unfinished.discard((tag, c.index))
        return list(merged.values())

    def usage(self) -> dict:
        cached = sum(self.cached_tokens) if self.prompt_tokens_details else None
        return usage(sum(self.prompt_tokens), self.completion_tokens, cached)

    def add_metrics(self, body: dict) -> dict:
        """With --enable-per-request-metrics: body["metrics"] (null when the request is not one stream)."""
        if self.timing_asked:
            body["metrics"] = self.timing.as_json() if self.timing is not None else None
        return body


# A finished choice, for non-streamed answers: the same record, with every delta folded in.
Result = Delta


async def collect(group: Any, tracker: Tracker) -> dict[tuple[int, int], Result]:
    """Run a RequestGroup to the end and return every choice whole."""
    results: dict[tuple[int, int], Result] = {}
    while not group.done:
        for d in tracker.fold(await group.next_items()):
            fold_completion(results.setdefault((d.prompt, d.index), Result(d.prompt, d.index)), d)
    for p in range(len(tracker.prompt_tokens)):
        for i in range(tracker.n):
            results.setdefault((p, i), Result(p, i, finish_reason="abort"))
    return results


async def start_group(engine: Any, response_id: str, prompts: list[Any], params: Any, **names: Any
                      ) -> tuple[RequestGroup, list[list[int]]]:
    """Queue every (prompt, n) completion of one API request; a request the engine refuses is a 400 (names:
    the request fields to blame, see AsyncEngine.submit). Returns the group and each prompt's token ids as
    the engine runs them (tokenized, truncated)."""
    group = RequestGroup(engine, response_id)
    try:
        with as_bad_request():
            prompt_ids = await group.start(prompts, params, **names)
    except EngineFailure as exc:  # the model's core died as the request was queued: 503
        raise engine_failure(exc) from exc
    return group, prompt_ids


async def collect_all(request: Request, group: Any, tracker: Tracker) -> dict[tuple[int, int], Result] | None:
    """A non-streamed request's results; None when the client left first (the caller answers 499)."""
    try:
        return await until_disconnect(request, collect(group, tracker))
    except ClientGone:
        return None
    except EngineFailure as exc:
        raise engine_failure(exc) from exc
    finally:
        group.abort()


class ChunkWriter:
    """The SSE chunks of one streamed response: the shared head, and usage the way OpenAI sends it
    (null on every chunk but a final one, or running totals with continuous_usage_stats)."""

    def __init__(self, head: dict, tracker: Tracker, req: Any) -> None:
        self.head = head
        self.tracker = tracker
        # --enable-force-include-usage: usage on every chunk, running totals (vLLM's should_include_usage).
        self.include_usage = bool(req.include_usage) or tracker.force_usage
        self.continuous = tracker.force_usage or (
            self.include_usage and bool(req.stream_options and req.stream_options.continuous_usage_stats))

    def choice(self, choice: dict, finish: str | None = None, stop: Any = None, top: dict | None = None) -> str:
        """One chunk holding one choice; top: fields at the chunk's top level (vLLM's prompt_token_ids)."""
        choice["finish_reason"] = finish
        if finish is not None:
            choice["stop_reason"] = stop
        body = {**self.head, **(top or {}), "choices": [choice]}
        if self.include_usage:
            body["usage"] = self.tracker.usage() if self.continuous else None
        return sse(body)

    def closing(self) -> str:
        usage_chunk = ""
        if self.include_usage:  # per-request metrics ride on the final usage chunk, as vLLM's
            usage_chunk = sse(self.tracker.add_metrics({**self.head, "choices": [], "usage": self.tracker.usage()}))
        return usage_chunk + SSE_DONE


async def stream_deltas(group: RequestGroup, tracker: Tracker, writer: ChunkWriter, response_id: str,
                        first: str, render: Any) -> Any:
    """The body of a streamed response: `first`, then render(delta) for each engine delta, then the
    closing chunks. Failures after the headers are reported in-band, as vLLM does."""
    log = logging.getLogger("wslm.server")
    try:
        if first:
            yield first
        while not group.done:
            try:
                deltas = tracker.fold(await group.next_items())
            except EngineFailure as exc:
                log.error("request %s failed: %s", response_id, exc)
                yield sse(engine_failure(exc).body()) + SSE_DONE
                return
            out = "".join(render(d) for d in deltas)
            if out:
                yield out
        yield writer.closing()
    except Exception as exc:  # noqa: BLE001 - headers are sent: report in-band
        log.exception("streaming %s failed", response_id)
        yield sse(internal_error(exc).body()) + SSE_DONE
    finally:
        group.abort()  # no-op when finished; frees the KV blocks when the client went away
