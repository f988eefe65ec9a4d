"""Sequence: one completion being generated (a request with n > 1 has n of them)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from wslm.backend.outputs import Logprob
from wslm.backend.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    seq_id: int
    request_id: str
    index: int  # position among the request's n completions
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    eos_token_ids: frozenset[int] = frozenset()
    status: SequenceStatus = SequenceStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    # Tokens whose KV is in the cache (prompt and generated alike): vLLM v1's single counter.
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    # Leading block_table entries given back because every layer's sliding window has moved past them;
    # they hold block_manager.NULL_BLOCK (positions keep their index: block_table[pos // block_size]).
    num_freed_blocks: int = 0
    # Hashes of the full blocks of this sequence, in order (prefix caching).
    block_hashes: list[int] = field(default_factory=list)
    num_cached_tokens: int = -1  # prefix-cache hit at first schedule; -1 until scheduled
    # Set on the first completion of an n > 1 request: how many siblings to fork off after the prompt.
    pending_forks: list[Sequence] = field(default_factory=list)
    # Speculative decoding: tokens proposed after this decode's last token, verified in this step (spec_decode/).
    spec_token_ids: list[int] = field(default_factory=list)
    grammar: object | None = None  # structured.GrammarState when the output must follow a grammar
    token_rules: object | None = None  # token_rules.TokenRules: logit_bias, allowed_token_ids, bad_words
    prompt_logprobs: list = field(default_factory=list)  # prompt_logprobs: one dict per prompt token after the first
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    error: str | None = None
    # Detokenizer state.
    output_text: str = ""
    sent_text_len: int = 0
    prefix_offset: int = 0
    read_offset: int = 0
    sent_token_len: int = 0
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    last_token_time: float | None = None
    num_preemptions: int = 0
    pooling: object | None = None  # PoolingParams of an embedding request (prefill only; pooling/decoder.py)
    images: tuple = ()  # multimodal.ImageInput of each image in the prompt (their tokens' embeddings)
    lora_request: object | None = None  # lora.LoRARequest: the adapter this sequence runs with (None: the base)

    @property
    def lora_int_id(self) -> int:
        return self.lora_request.lora_int_id if self.lora_request is not None else 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_at(self, i: int) -> int:
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[i] if i < n else self.output_token_ids[i - n]

    def tokens_slice(self, start: int, end: int) -> list[int]:
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED


@dataclass(slots=True)
class RequestState:
    """One request as the engine tracks it: its n sequences and what was already reported."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    seqs: list[Sequence]
    arrival_time: float
    prompt_logprobs_sent: bool = False
