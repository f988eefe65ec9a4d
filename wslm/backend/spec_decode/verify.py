"""The worker's side of a speculative step: the target scored k + 1 positions of each speculating sequence in
one forward; here each position gets the request's full logits processing as if its earlier drafts had been
generated (penalties, min_tokens, bad words, the grammar row the engine filled for it), then the run's tokens
are chosen (rejection.py) and their logprobs read off the same rows."""

from __future__ import annotations

import dataclasses

import torch

from wslm.backend.engine.step_inputs import SampleRow
from wslm.backend.spec_decode.rejection import accept_greedy, accept_sampled


def _position_row(seq: SampleRow, drafts: list[int], i: int) -> SampleRow:
    """What the sampler reads at the i-th verified position: seq as if drafts[:i] were already generated
    (its output tokens are in the row when its settings read them: SampleRow.of)."""
    p = seq.params
    outputs = seq.output_token_ids
    if i and (p.has_penalties or p.min_tokens or (seq.token_rules and seq.token_rules.bad_words)):
        outputs = outputs + drafts[:i]
    return dataclasses.replace(seq, output_token_ids=outputs, num_output_tokens=seq.num_output_tokens + i)


@torch.inference_mode()
def verify(sampler, logits: torch.Tensor, seqs: list[SampleRow], drafts: list[list[int]],
           bitmasks: list[torch.Tensor | None]) -> tuple[list[list[int]], list[list]]:
    """logits: [sum(k_i + 1), vocab], each sequence's rows in order. bitmasks: per sequence its grammar's
    [k_i + 1, words] rows, or None. sampler: worker.sampler.Sampler. Returns each sequence's new tokens
    (1..k_i + 1) and their logprobs."""
    rows: list[SampleRow] = []
    starts: list[int] = []
    mask_rows: list[int] = []
    masks: list[torch.Tensor] = []
    for seq, d, bm in zip(seqs, drafts, bitmasks):
        starts.append(len(rows))
        if bm is not None:
            mask_rows.extend(range(len(rows), len(rows) + len(d) + 1))
            masks.append(bm[: len(d) + 1])
        rows.extend(_position_row(seq, d, i) for i in range(len(d) + 1))
    grammar = (mask_rows, torch.cat(masks)) if masks else None
    processed, raw = sampler.process(logits, rows, grammar)
    argmax = processed.argmax(dim=-1).tolist()
    tokens: list[list[int]] = []
    logprobs: list[list] = []
    for seq, d, start in zip(seqs, drafts, starts):
        span = range(start, start + len(d) + 1)
        p = seq.params
        if p.greedy:
            out = accept_greedy(argmax[span.start : span.stop], d)
        else:
            probs = sampler.probs(processed[span.start : span.stop], [p] * len(span), [False] * len(span))
            out = accept_sampled(probs, d, sampler.noise(probs, seq))  # each position's draw, as a plain step's
        tokens.append(out)
        if p.logprobs is not None and raw is not None:
            used = raw[span.start : span.start + len(out)]
            logprobs.append(sampler._logprobs(used, out, [p] * len(out), [True] * len(out)))
        else:
            logprobs.append([None] * len(out))
    return tokens, logprobs
