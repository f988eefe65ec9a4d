"""prompt_logprobs (vLLM's): the logprob of every prompt token given the ones before it, plus the top-N.

The step asks the model for extra logits rows (after the sampled rows) at the prompt positions of requests
that want them (which: engine/step_inputs.prompt_logprob_positions); the sampling rank turns those rows into
one dict per prompt token here. Requests with prompt_logprobs skip the prefix cache (as in vLLM): a cached
prefix has no logits to report."""

from __future__ import annotations

import torch

from wslm.backend.outputs import Logprob


def compute_prompt_logprobs(rows: list[tuple[list[int], int]], logits: torch.Tensor, vocab_size: int
                            ) -> list[list[dict]]:
    """rows: (the prompt tokens scored, top-k wanted) per prompt_logprobs row, in the order of the logits
    rows (what prepare_step appended after the sampled rows). One list of {token id: Logprob} per row, the
    decoded text left None (the front end has the tokenizer)."""
    logprobs = torch.log_softmax(logits[:, :vocab_size].float(), dim=-1)
    out: list[list[dict]] = []
    r = 0
    for target_ids, k in rows:
        count = len(target_ids)
        block = logprobs[r : r + count]
        r += count
        targets = torch.tensor(target_ids, device=block.device)
        chosen = block.gather(1, targets.unsqueeze(1)).squeeze(1)
        ranks = (block > chosen.unsqueeze(1)).sum(dim=-1) + 1
        k = vocab_size if k == -1 else min(k, vocab_size)
        top_vals, top_ids = block.topk(k, dim=-1) if k else (None, None)
        entries = []
        for j, (target, value, rank) in enumerate(zip(target_ids, chosen.tolist(), ranks.tolist())):
            entry = {target: Logprob(value, rank, None)}
            if k:
                for rk, (tid, val) in enumerate(zip(top_ids[j].tolist(), top_vals[j].tolist()), start=1):
                    if tid not in entry:
                        entry[tid] = Logprob(val, rk, None)
            entries.append(entry)
        out.append(entries)
    return out
