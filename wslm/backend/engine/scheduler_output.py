"""SchedulerOutput: what the engine core hands its executor for one step (vLLM's name and role). It holds the
core's live Sequences; the executor turns it into plain StepInputs and a SamplingBatch (engine/step_inputs.py)
for its workers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from wslm.backend.sequence import Sequence


@dataclass(slots=True)
class SchedulerOutput:
    """What the engine core hands the executor for one step.

    scheduled: each sequence with its number of new tokens this step. sample_seqs / sample_rows: who gets a
    new token and from which of the step's sampled logits rows (an n > 1 request's siblings, forked this
    step, share their first completion's row). prompt_rows: the sequences (and prompt positions) whose
    prompt_logprobs this step computes, in the order prepare_step appends their rows."""

    scheduled: list[tuple[Sequence, int]]
    sample_seqs: list[Sequence]
    sample_rows: list[int]
    prompt_rows: list[tuple[Sequence, range]]
    finished_seq_ids: list[int] = field(default_factory=list)  # since the last step: workers drop their state
    spec: Any = None  # spec_decode.engine_hook.SpecBatch when some sequence speculates this step

    def prompt_targets(self) -> list[tuple[list[int], int]]:
        """Per prompt_logprobs row: the prompt tokens it scores and how many top entries it wants."""
        return [(seq.prompt_token_ids[r.start + 1 : r.stop + 1], seq.params.prompt_logprobs)
                for seq, r in self.prompt_rows]

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)
