"""SamplingParams, as in vLLM: how one request is decoded and when it stops."""

from __future__ import annotations

from dataclasses import dataclass, field

from wslm.backend.structured.params import GuidedDecodingParams, StructuredOutputsParams

_GREEDY_EPS = 1e-5


@dataclass(slots=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16  # None: up to the context length
    min_tokens: int = 0
    logprobs: int | None = None  # top-N logprobs per generated token (the sampled one is always included)
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    # Token constraints (vLLM's names): checked against the vocabulary by validation.check_sampling.
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit, in [-100, 100]
    allowed_token_ids: list[int] | None = None  # only these may be sampled
    bad_words: list[str] | None = None  # words never generated (as whole token sequences)
    prompt_logprobs: int | None = None  # top-N logprobs for every prompt token (besides the prompt's own)
    truncate_prompt_tokens: int | None = None  # keep only the last k prompt tokens (-1: the context length)
    truncation_side: str | None = None  # vLLM's: "left" (the default) keeps the last k tokens, "right" the first k
    # vLLM's: logprobs of exactly these ids at each generated position (besides the sampled token's), instead
    # of the top `logprobs` (scoring a fixed label set without asking for the whole vocabulary).
    logprob_token_ids: list[int] | None = None
    structured_outputs: StructuredOutputsParams | None = None  # JSON schema / regex / choice / grammar
    guided_decoding: GuidedDecodingParams | None = None  # vLLM's older name; moved to structured_outputs
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in (self.stop or []) if s]
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        if self.guided_decoding is not None:
            if self.structured_outputs is not None and self.structured_outputs is not self.guided_decoding:
                raise ValueError("Give structured_outputs or guided_decoding (its older name), not both.")
            self.structured_outputs, self.guided_decoding = self.guided_decoding, None
        if self.logit_bias:
            self.logit_bias = _int_keys(self.logit_bias)
        self._verify()

    def _verify(self) -> None:
        def bad(name: str, rule: str) -> ValueError:
            return ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}.")

        if not isinstance(self.n, int) or self.n < 1:
            raise bad("n", "an integer of at least 1")
        if self.temperature < 0:
            raise bad("temperature", "non-negative")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise bad("top_k", "0 (off), -1 (off) or a positive integer")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "in [0, 1]")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise bad("presence_penalty", "in [-2, 2]")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise bad("frequency_penalty", "in [-2, 2]")
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise bad("repetition_penalty", "in (0, 10]")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise bad("max_tokens", "a positive integer")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise bad("min_tokens", "a non-negative integer")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens}).")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or self.logprobs < -1):
            raise bad("logprobs", "a non-negative integer (at most the engine's max_logprobs, 20 by default) "
                      "or -1 (the whole vocabulary, when max_logprobs is -1)")
        if self.seed is not None and not isinstance(self.seed, int):
            raise bad("seed", "an integer")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}.")
        self._verify_constraints()

    def _verify_constraints(self) -> None:
        for token, bias in (self.logit_bias or {}).items():
            if not isinstance(bias, (int, float)) or not -100.0 <= bias <= 100.0:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias!r} for token {token}.")
        if self.allowed_token_ids is not None and (
            not self.allowed_token_ids or any(isinstance(t, bool) or not isinstance(t, int) for t in self.allowed_token_ids)
        ):
            raise ValueError(f"allowed_token_ids must be a non-empty list of token ids, got {self.allowed_token_ids!r}.")
        if self.bad_words is not None and any(not isinstance(w, str) or not w.strip() for w in self.bad_words):
            raise ValueError(f"bad_words must be non-empty strings, got {self.bad_words!r}.")
        if self.prompt_logprobs is not None and (not isinstance(self.prompt_logprobs, int) or self.prompt_logprobs < -1):
            raise ValueError(f"prompt_logprobs must be a non-negative integer (or -1), got {self.prompt_logprobs!r}.")
        t = self.truncate_prompt_tokens
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or (t < 1 and t != -1)):
            raise ValueError(f"truncate_prompt_tokens must be a positive integer or -1, got {t!r}.")
        if self.truncation_side not in (None, "left", "right"):
            raise ValueError(f'truncation_side must be "left" or "right", got {self.truncation_side!r}.')
        ids = self.logprob_token_ids
        if ids is not None and (not ids or not isinstance(ids, list)
                                or any(isinstance(t, bool) or not isinstance(t, int) for t in ids)):
            raise ValueError(f"logprob_token_ids must be a non-empty list of token ids, got {ids!r}.")
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise ValueError("structured_outputs must be a StructuredOutputsParams.")

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    def clone(self, **changes) -> SamplingParams:
        values = {name: getattr(self, name) for name in self.__dataclass_fields__}
        values["stop"] = list(self.stop or [])
        values["stop_token_ids"] = list(self.stop_token_ids or [])
        values["extra"] = dict(self.extra)
        values["guided_decoding"] = None  # already folded into structured_outputs
        values.update(changes)
        return SamplingParams(**values)


def _int_keys(bias: dict) -> dict[int, float]:
    """OpenAI sends logit_bias keys as strings ("50256"); the engine wants token ids. Every bad key is named at
    once, so a client fixes its map in one go."""
    out, bad = {}, []
    for key, value in bias.items():
        try:
            out[int(key)] = value
        except (TypeError, ValueError):
            bad.append(repr(key))
    if bad:
        shown = ", ".join(bad[:10]) + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
        raise ValueError(f"logit_bias keys must be token ids, got {shown}.")
    return out
