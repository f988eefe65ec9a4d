"""Choosing the tokens of a verified run. Both proposers here propose deterministically (n-gram lookup, and the
draft model's argmax), so the draft distribution q is a point mass on each proposed token d. The standard
speculative-sampling rule (accept d with probability min(1, p(d) / q(d)), else sample from the residual
max(p - q, 0) renormalized) then reads: accept d with probability p(d); on a rejection sample from p with d
removed. Every emitted token is then distributed exactly as the target's p (Leviathan et al. 2023), so a
sampled request sees the same distribution with and without speculation."""

from __future__ import annotations

import torch


def accept_greedy(targets: list[int], drafts: list[int]) -> list[int]:
    """targets: the target's argmax at each of the k + 1 positions. The longest prefix of drafts the target
    agrees with, then the target's own token (the correction, or the bonus after a full match)."""
    out: list[int] = []
    for d, t in zip(drafts, targets):
        if d != t:
            break
        out.append(d)
    out.append(targets[len(out)])
    return out


def accept_sampled(probs: torch.Tensor, drafts: list[int], generator: torch.Generator | None) -> list[int]:
    """probs: [k + 1, vocab], the target's final sampling distribution at each position (temperature, top-k/p,
    min-p applied). Two draws per run: k uniforms, and one categorical sample (the correction or bonus)."""
    k = len(drafts)
    probs = probs / probs.sum(dim=-1, keepdim=True)  # min-p leaves the rows unnormalized; acceptance reads p(d)
    out: list[int] = []
    if k:
        d = torch.tensor(drafts, device=probs.device)
        p_draft = probs[:k].gather(1, d.unsqueeze(1)).squeeze(1)
        u = torch.rand(k, generator=generator, device=probs.device)
        accepted = (u < p_draft).tolist()
        j = accepted.index(False) if False in accepted else k
        out = list(drafts[:j])
    else:
        j = 0
    row = probs[j]
    if j < k:
        row = row.clone()
        row[drafts[j]] = 0.0  # the residual max(p - q, 0) for a point-mass q
    total = row.sum()
    if total <= 0:  # p put all its mass on the rejected token: cannot happen (it would have been accepted)
        row, total = probs[j], probs[j].sum()
    out.append(int(torch.multinomial(row / total, 1, generator=generator).item()))
    return out
