"""Sampling a speculative step, on the sampling rank (worker/model_runner.sample_step calls it): the target
scored every sequence's scheduled tokens in one batched forward (k + 1 rows for a speculating sequence, one for
the rest); the others sample as usual and the speculating ones are verified (verify.py). The draft model, if
any, proposed before the step (the one-device executor, executor/uniproc.py)."""

from __future__ import annotations

import torch

from wslm.backend.engine.step_inputs import ModelRunnerOutput, SamplingBatch
from wslm.backend.spec_decode.verify import verify


def sample_speculative(sampler, logits: torch.Tensor, batch: SamplingBatch, prompt: list) -> ModelRunnerOutput:
    """batch.sample_rows: each entry's first logits row; batch.drafts: each entry's drafts ([]: a plain one).
    prompt: the step's prompt_logprobs rows, already computed."""
    drafts = batch.drafts
    n = len(batch.rows)
    tokens: list[list[int]] = [[] for _ in range(n)]
    logprobs: list[list] = [[] for _ in range(n)]
    plain = [i for i in range(n) if not drafts[i]]
    if plain:
        rows = logits.index_select(0, torch.tensor([batch.sample_rows[i] for i in plain], device=logits.device))
        grammar = None
        if batch.bitmask is not None:  # the grammar rows are entries' (all plain): renumbered within plain
            where = {i: j for j, i in enumerate(plain)}
            grammar = ([where[i] for i in batch.bitmask_rows], batch.bitmask)
        res = sampler(rows, [batch.rows[i] for i in plain], grammar)
        for i, t, lp in zip(plain, res.token_ids, res.logprobs):
            tokens[i], logprobs[i] = [t], [lp]
    specs = [i for i in range(n) if drafts[i]]
    if specs:
        index = [batch.sample_rows[i] + j for i in specs for j in range(1 + len(drafts[i]))]
        rows = logits.index_select(0, torch.tensor(index, device=logits.device))
        toks, lps = verify(sampler, rows, [batch.rows[i] for i in specs], [drafts[i] for i in specs],
                           [batch.spec_bitmasks[i] for i in specs])
        for i, t, lp in zip(specs, toks, lps):
            tokens[i], logprobs[i] = t, lp
    return ModelRunnerOutput([t[0] for t in tokens], [lp[0] for lp in logprobs], prompt, tokens, logprobs)
