"""StepInputs: one scheduled step as plain host-side lists. The engine builds it once; the model runner
turns it into tensors, and tensor-parallel workers receive it as it is (it pickles small and fast)."""

from __future__ import annotations

from dataclasses import dataclass

from wslm.backend.sequence import Sequence
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
    for seq, n in scheduled:
        start = seq.num_computed_tokens
        end = start + n
        input_ids.extend(seq.tokens_slice(start, end))
        positions.extend(range(start, end))
        table = seq.block_table
        if n == 1:
            slots.append(table[start // bs] * bs + start % bs)
        else:
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
        prompt_rows.extend(cu[-1] + p - start for p in prompt_logprob_positions(seq, n))
        cu.append(cu[-1] + n)
        seq_lens.append(end)
        max_q = max(max_q, n)
        if end == seq.num_tokens:  # reached the end of what is known: a new token is due
            logits_idx.append(cu[-1] - 1)
            sampled.append(seq)
    max_blocks = -(-max(seq_lens) // bs)
    tables = [seq.block_table[:max_blocks] + [0] * (max_blocks - len(seq.block_table)) for seq, _ in scheduled]
    step = StepInputs(input_ids, positions, slots, cu, seq_lens, logits_idx + prompt_rows, tables, max_q)
    return step, sampled
