"""StepInputs: one scheduled step as plain host-side lists. The engine builds it once; the model runner
turns it into tensors, and tensor-parallel workers receive it as it is (it pickles small and fast)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from wslm.backend.multimodal import rope_positions
from wslm.backend.sequence import Sequence
from wslm.backend.worker.image_embeds import image_rows
from wslm.backend.worker.prompt_logprobs import prompt_logprob_positions


@dataclass(slots=True)
class StepInputs:
    input_ids: list[int]
    positions: list[int]
    slots: list[int]  # where each new token's K/V goes in the paged pool
    cu_seqlens_q: list[int]
    seq_lens: list[int]  # KV length of each sequence including the new tokens
    # Rows whose logits are returned: the last token of each sequence that samples, then prompt_logprobs rows.
    logits_indices: list[int]
    block_tables: list[list[int]]  # padded to the longest table of the step
    max_seqlen_q: int
    prompt_logprob_rows: int = 0  # how many of logits_indices are prompt_logprobs rows (the last ones)
    # Image tokens this step computes: (first row in the step, first and end index into the image's
    # embeddings, multimodal.ImageInput, sequence index); their rows take the image's embeddings.
    images: list = field(default_factory=list)


def prepare_step(scheduled: list[tuple[Sequence, int]], block_size: int) -> tuple[StepInputs, list[Sequence]]:
    bs = block_size
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    cu = [0]
    seq_lens: list[int] = []
    logits_idx: list[int] = []
    sampled: list[Sequence] = []
    max_q = 0
    prompt_rows: list[int] = []  # prompt_logprobs rows, after the sampled ones (see prompt_logprobs.py)
    row_seqs: list[Sequence] = []  # whose block table each query row reads
    images: list = []
    for seq, n in scheduled:
        start = seq.num_computed_tokens
        end = start + n
        table = seq.block_table
        if seq.spec_token_ids:
            # A speculative decode: its last token and each draft as a one-token row of its own that attends up
            # to its position (all K/V are written before any row attends), so that verification is a decode
            # batch the fast decode paths take (CPU plan, CUDA graphs) rather than a prefill.
            shift = rope_positions(seq.images, start, start + 1)[0] - start if seq.images else 0  # M-RoPE delta
            for i, token in enumerate([seq.token_at(start), *seq.spec_token_ids]):
                pos = start + i
                input_ids.append(token)
                positions.append(pos + shift)
                slots.append(table[pos // bs] * bs + pos % bs)
                cu.append(cu[-1] + 1)
                seq_lens.append(pos + 1)
                logits_idx.append(cu[-1] - 1)
                row_seqs.append(seq)
            max_q = max(max_q, 1)
            sampled.append(seq)
            continue
        input_ids.extend(seq.tokens_slice(start, end))
        # Rotary positions: the token indices, shifted after a Qwen2.5-VL image (M-RoPE; a decode token's is its
        # index + the sequence's delta, one number, so the fast decode paths run it as plain rope).
        positions.extend(rope_positions(seq.images, start, end) if seq.images else range(start, end))
        if n == 1:
            slots.append(table[start // bs] * bs + start % bs)
        else:
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
        prompt_rows.extend(cu[-1] + p - start for p in prompt_logprob_positions(seq, n))
        if seq.images:
            images.extend(image_rows(seq.images, start, end, cu[-1], len(cu) - 1))
        cu.append(cu[-1] + n)
        seq_lens.append(end)
        row_seqs.append(seq)
        max_q = max(max_q, n)
        if end == seq.num_tokens:  # reached the end of what is known: a new token is due
            logits_idx.append(cu[-1] - 1)
            sampled.append(seq)
    max_blocks = -(-max(seq_lens) // bs)
    tables = [seq.block_table[:max_blocks] + [0] * (max_blocks - len(seq.block_table)) for seq in row_seqs]
    step = StepInputs(input_ids, positions, slots, cu, seq_lens, logits_idx + prompt_rows, tables, max_q,
                      len(prompt_rows), images)
    return step, sampled


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


@dataclass(slots=True)
class ModelRunnerOutput:
    """What one step gives back: a token per sample_seqs entry (and its logprobs when asked for), and the
    prompt_logprobs rows (one {token id: Logprob} per prompt position; decoded text filled in later by the
    front end, which holds the tokenizer)."""

    token_ids: list[int]
    logprobs: list[tuple[float, int, list[int], list[float]] | None]
    prompt_logprobs: list[list[dict]]
    # A speculative step: every new token per sample_seqs entry (1 + accepted drafts), and their logprobs.
    spec_token_ids: list[list[int]] | None = None
    spec_logprobs: list[list] | None = None


@dataclass(slots=True)
class SampleRow:
    """What the sampler reads of one sequence, small enough to send to a tensor-parallel rank 0 every step:
    token lists only when its settings read them (penalties, min_tokens, bad words)."""

    seq_id: int
    params: Any  # SamplingParams
    eos_token_ids: frozenset[int]
    num_output_tokens: int
    output_token_ids: list[int]
    prompt_token_ids: list[int]
    token_rules: Any = None
    generator: Any = None  # filled in by the worker that samples (seeded requests)
    grammar: Any = None  # never sent: the engine sends the grammar's bitmask row instead

    @classmethod
    def of(cls, seq: Sequence) -> SampleRow:
        p = seq.params
        outputs = p.has_penalties or bool(p.min_tokens) or bool(seq.token_rules and seq.token_rules.bad_words)
        return cls(seq.seq_id, p, seq.eos_token_ids, seq.num_output_tokens,
                   list(seq.output_token_ids) if outputs else [],
                   seq.prompt_token_ids if p.repetition_penalty != 1.0 else [], seq.token_rules)

    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids


@dataclass(slots=True)
class SamplingBatch:
    """What a tensor-parallel rank 0 needs to sample a step itself, so that only token ids come back."""

    rows: list[SampleRow]
    sample_rows: list[int]
    prompt_targets: list[tuple[list[int], int]]
    bitmask_rows: list[int]  # rows constrained by a grammar...
    bitmask: Any = None  # ...and their xgrammar bitmask (int32 [len(bitmask_rows), vocab / 32]), or None
    finished_seq_ids: list[int] = field(default_factory=list)
