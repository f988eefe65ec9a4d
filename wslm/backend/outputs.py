"""What the engine hands back, named as in vLLM: RequestOutput holding CompletionOutputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from wslm.backend.errors import ErrorKind

# How the message of a request that failed for lack of memory begins (its error_kind says so, typed).
OUT_OF_MEMORY_ERROR = "Out of memory"


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int  # 1 = most likely
    decoded_token: str | None = ""  # None until the front end decodes it (prompt_logprobs)


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    # One dict per generated token: token id -> Logprob (the sampled token plus the top-N).
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None  # "stop", "length", "abort", "error" or None while running
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None


@dataclass(slots=True)
class RequestOutput:
    """From LLMEngine.step(): a delta (only what is new this step, only the completions that moved).
    From LLM.generate()/chat(): the whole result."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None
    error: str | None = None  # set when the engine failed this request (finish_reason "error")
    error_kind: ErrorKind | None = None  # why (out of memory: the server answers 503, else 500)
    extra: dict = field(default_factory=dict)
    # prompt_logprobs: None for the first token, then token id -> Logprob per prompt token (the first delta).
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None


def fold_completion(total: Any, delta: Any) -> None:
    """Fold one stream delta of a completion into its running total: the one place that knows how deltas
    add up (LLM.generate, the server's per-batch merge and its non-streamed answers, `wslm generate`).
    Works on anything with CompletionOutput's fields, so the server's per-choice records use it too."""
    total.text += delta.text
    total.token_ids.extend(delta.token_ids)
    if delta.logprobs is not None:
        total.logprobs = (total.logprobs or []) + list(delta.logprobs)
    if getattr(delta, "cumulative_logprob", None) is not None and hasattr(total, "cumulative_logprob"):
        total.cumulative_logprob = delta.cumulative_logprob
    if delta.finish_reason is not None:
        total.finish_reason, total.stop_reason = delta.finish_reason, delta.stop_reason


def fold_output(results: dict[str, RequestOutput], delta: RequestOutput) -> RequestOutput:
    """Fold one step's RequestOutput delta into the running total for its request (kept in results)."""
    total = results.get(delta.request_id)
    if total is None:
        total = results[delta.request_id] = RequestOutput(delta.request_id, delta.prompt, delta.prompt_token_ids,
                                                          [], False)
    by_index = {c.index: c for c in total.outputs}
    for c in delta.outputs:
        acc = by_index.get(c.index)
        if acc is None:
            acc = by_index[c.index] = CompletionOutput(c.index, "", [])
        fold_completion(acc, c)
    total.outputs = [by_index[i] for i in sorted(by_index)]
    total.finished = delta.finished
    total.num_cached_tokens = delta.num_cached_tokens
    total.metrics = delta.metrics
    total.error = delta.error
    total.error_kind = delta.error_kind
    total.extra.update(delta.extra)
    if delta.prompt_logprobs is not None:
        total.prompt_logprobs = delta.prompt_logprobs
    return total


@dataclass(slots=True)
class PoolingOutput:
    data: Any  # a 1-D fp32 torch tensor on the CPU: the finished (pooled, cut, normalised) embedding

    @property
    def embedding(self) -> list[float]:
        return self.data.tolist()


@dataclass(slots=True)
class PoolingRequestOutput:
    """One embedding request's result (vLLM's name): the engine sends it once, finished."""

    request_id: str
    outputs: PoolingOutput | None
    prompt_token_ids: list[int]
    finished: bool = True
    error: str | None = None  # set when the engine failed (or aborted) this request; outputs is None
