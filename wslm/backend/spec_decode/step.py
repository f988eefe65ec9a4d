"""One speculative step on a single-device executor: the draft model (if any) proposes, the target scores
every sequence's scheduled tokens in one batched forward (k + 1 rows for a speculating sequence, one for the
rest), the others sample as usual and the speculating ones are verified (verify.py)."""

from __future__ import annotations

import torch

from wslm.backend.spec_decode.verify import verify
from wslm.backend.worker.prompt_logprobs import compute_prompt_logprobs
from wslm.backend.worker.step_inputs import ModelRunnerOutput


class SpecStep:
    def __init__(self, draft=None) -> None:
        self.draft = draft  # draft.DraftProposer, or None (n-gram: the engine proposed already)

    def execute(self, runner, sampler, so, vocab_size: int) -> ModelRunnerOutput:
        spec = so.spec
        if self.draft is not None and spec.seqs:
            drafts = self.draft.propose(spec.seqs, [len(s.spec_token_ids) for s in spec.seqs])
            for seq, d in zip(spec.seqs, drafts):
                seq.spec_token_ids[:] = d
        logits, sampled = runner.execute(so.scheduled)
        offsets, r = {}, 0
        for i, seq in enumerate(sampled):
            offsets[i] = r
            r += 1 + len(seq.spec_token_ids)
        targets = so.prompt_targets()
        prompt = compute_prompt_logprobs(targets, logits[r:], vocab_size) if targets else []
        n = len(so.sample_seqs)
        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list] = [[] for _ in range(n)]
        plain = [i for i, s in enumerate(so.sample_seqs) if not s.spec_token_ids]
        if plain:
            rows = logits.index_select(0, torch.tensor([offsets[so.sample_rows[i]] for i in plain],
                                                       device=logits.device))
            res = sampler(rows, [so.sample_seqs[i] for i in plain])
            for i, t, lp in zip(plain, res.token_ids, res.logprobs):
                tokens[i], logprobs[i] = [t], [lp]
        specs = [i for i, s in enumerate(so.sample_seqs) if s.spec_token_ids]
        if specs:
            seqs = [so.sample_seqs[i] for i in specs]
            index = [offsets[so.sample_rows[i]] + j for i, s in zip(specs, seqs)
                     for j in range(1 + len(s.spec_token_ids))]
            rows = logits.index_select(0, torch.tensor(index, device=logits.device))
            drafts = [list(s.spec_token_ids) for s in seqs]
            toks, lps = verify(sampler, rows, seqs, drafts, [spec.bitmasks.get(s.seq_id) for s in seqs])
            for i, seq, d, t, lp in zip(specs, seqs, drafts, toks, lps):
                tokens[i], logprobs[i] = t, lp
                if self.draft is not None:
                    self.draft.verified(seq, len(t), len(d))
        return ModelRunnerOutput([t[0] for t in tokens], [lp[0] for lp in logprobs], prompt, tokens, logprobs)
