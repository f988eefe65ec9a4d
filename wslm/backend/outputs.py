"""What the engine hands back, named as in vLLM: RequestOutput holding CompletionOutputs."""

from __future__ import annotations

from dataclasses import dataclass, field

# RequestOutput.error starts with this when the request failed for lack of memory: the server answers 503
# (try again later / smaller), not 500.
OUT_OF_MEMORY_ERROR = "Out of memory"


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int  # 1 = most likely
    decoded_token: str = ""


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
    extra: dict = field(default_factory=dict)
