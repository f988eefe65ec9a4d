"""Beam search as vLLM does it, on top of ordinary requests: each step asks the engine for one token with the
top 2 x beam_width logprobs for every live beam, keeps the beam_width best extensions by their length-
penalized score, and sets finished beams (EOS) aside. The prefix cache makes each step's prompts cheap.

BeamSearch is the search of one prompt, stepped by a driver: LLM.beam_search (offline) and the server's
`use_beam_search` both drive it, so both give the same beams."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from wslm.backend.outputs import Logprob, RequestOutput
from wslm.backend.sampling_params import SamplingParams


@dataclass
class BeamSearchParams:
    """vLLM's BeamSearchParams."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.beam_width:
            raise ValueError(f"beam_width must be at least 1, got {self.beam_width}.")
        if not 1 <= self.max_tokens:
            raise ValueError(f"max_tokens must be at least 1 for beam search, got {self.max_tokens}.")


@dataclass
class BeamSearchSequence:
    """One beam: the prompt's tokens and then the generated ones (vLLM's shape)."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    num_prompt_tokens: int = 0

    @property
    def token_ids(self) -> list[int]:
        """The generated tokens alone."""
        return self.tokens[self.num_prompt_tokens:]


@dataclass
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]


def beam_score(tokens: list[int], cum_logprob: float, eos_ids: set[int], length_penalty: float) -> float:
    """vLLM's (and HF's) score: the summed logprob over the length to the power length_penalty; a final EOS
    does not count towards the length."""
    length = len(tokens) - (1 if tokens and tokens[-1] in eos_ids else 0)
    return cum_logprob / (max(length, 1) ** length_penalty)


class BeamSearch:
    """The search of one prompt. step_prompts() -> run them with step_params() -> advance(outputs), until done."""

    def __init__(self, prompt_ids: list[int], params: BeamSearchParams, eos_ids: set[int], max_model_len: int):
        self.params = params
        self.eos_ids = set(eos_ids)
        self.max_model_len = max_model_len
        self.num_prompt = len(prompt_ids)
        self.live = [BeamSearchSequence(list(prompt_ids), num_prompt_tokens=self.num_prompt)]
        self.finished: list[BeamSearchSequence] = []
        self.steps = 0

    @property
    def done(self) -> bool:
        return not self.live

    def step_prompts(self) -> list[list[int]]:
        return [beam.tokens for beam in self.live]

    def step_params(self) -> SamplingParams:
        # Twice the width: enough candidates left after some of them end in EOS (vLLM's choice). ignore_eos: the
        # one token is taken whatever it is; the search decides what an EOS ends.
        return SamplingParams(max_tokens=1, logprobs=2 * self.params.beam_width, temperature=self.params.temperature,
                              ignore_eos=True)

    def advance(self, outputs: list[RequestOutput]) -> None:
        """Extend every live beam by its candidates; keep the best beam_width."""
        width, eos_ok = self.params.beam_width, not self.params.ignore_eos
        candidates: list[BeamSearchSequence] = []
        for beam, out in zip(self.live, outputs):
            if out.error:
                raise RuntimeError(out.error)
            step = (out.outputs[0].logprobs or [{}])[0]
            for token, lp in step.items():
                cand = BeamSearchSequence(beam.tokens + [token], beam.logprobs + [step], beam.cum_logprob + lp.logprob,
                                          num_prompt_tokens=self.num_prompt)
                if eos_ok and token in self.eos_ids:
                    cand.finish_reason = "stop"
                    self.finished.append(cand)
                else:
                    candidates.append(cand)
        self.steps += 1
        candidates.sort(key=self._score, reverse=True)
        self.live = candidates[:width]
        if self.steps >= self.params.max_tokens or (self.live and len(self.live[0].tokens) >= self.max_model_len):
            for beam in self.live:
                beam.finish_reason = "length"
            self.finished += self.live
            self.live = []

    def _score(self, beam: BeamSearchSequence) -> float:
        return beam_score(beam.tokens, beam.cum_logprob, self.eos_ids, self.params.length_penalty)

    def result(self, tokenizer: Any) -> list[BeamSearchSequence]:
        """The best beam_width beams, best first, with their text (EOS left out of it)."""
        best = sorted(self.finished, key=self._score, reverse=True)[: self.params.beam_width]
        for beam in best:
            ids = beam.token_ids
            if beam.finish_reason == "stop" and not self.params.include_stop_str_in_output:
                ids = ids[:-1]
            beam.text = tokenizer.decode(ids, skip_special_tokens=True)
        return best

