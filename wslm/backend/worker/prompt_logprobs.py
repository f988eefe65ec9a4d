"""prompt_logprobs (vLLM's): the logprob of every prompt token given the ones before it, plus the top-N.

The step asks the model for extra logits rows (after the sampled rows) at the prompt positions of requests
that want them; the engine turns those rows into one dict per prompt token here. Requests with
prompt_logprobs skip the prefix cache (as in vLLM): a cached prefix has no logits to report."""

from __future__ import annotations

import torch

from wslm.backend.outputs import Logprob
from wslm.backend.sequence import Sequence


def prompt_logprob_positions(seq: Sequence, num_new: int) -> range:
    """Positions of this step's chunk whose logits score the next prompt token, skipping those already
    recorded (a preempted sequence recomputes its prompt)."""
    if getattr(seq.params, "prompt_logprobs", None) is None:  # embedding requests carry PoolingParams
        return range(0)
    start = seq.num_computed_tokens
    lo = max(start, len(seq.prompt_logprobs))
    hi = min(start + num_new, seq.num_prompt_tokens - 1)
    return range(lo, hi) if hi > lo else range(0)


def record_prompt_logprobs(rows: list[tuple[Sequence, range]], logits: torch.Tensor, tokenizer,
                           vocab_size: int) -> None:
    """rows and logits in the same order (what prepare_step appended after the sampled rows)."""
    logprobs = torch.log_softmax(logits[:, :vocab_size].float(), dim=-1)
    r = 0
    for seq, positions in rows:
        count = len(positions)
        block = logprobs[r : r + count]
        r += count
        targets = torch.tensor(seq.prompt_token_ids[positions.start + 1 : positions.stop + 1], device=block.device)
        chosen = block.gather(1, targets.unsqueeze(1)).squeeze(1)
        ranks = (block > chosen.unsqueeze(1)).sum(dim=-1) + 1
        k = seq.params.prompt_logprobs
        k = vocab_size if k == -1 else min(k, vocab_size)
        top_vals, top_ids = block.topk(k, dim=-1) if k else (None, None)
        for j, (target, value, rank) in enumerate(zip(targets.tolist(), chosen.tolist(), ranks.tolist())):
            entry = {target: Logprob(value, rank, tokenizer.decode([target]))}
            if k:
                for rk, (tid, val) in enumerate(zip(top_ids[j].tolist(), top_vals[j].tolist()), start=1):
                    if tid not in entry:
                        entry[tid] = Logprob(val, rk, tokenizer.decode([tid]))
            seq.prompt_logprobs.append(entry)
