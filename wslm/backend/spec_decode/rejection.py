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


def accept_sampled(probs: torch.Tensor, drafts: list[int], noise: torch.Tensor) -> list[int]:
    """probs: [k + 1, vocab], the target's final sampling distribution at each position (temperature, top-k/p,
    min-p applied; rows need not be normalized). noise: [k + 1, vocab] of Exp(1) draws, each row the one the
    plain sampler would draw for that position. Each position's token is the plain sampler's own (the
    exponential race argmax(p / E)), and the drafts are accepted while they equal it: for a point-mass q that
    is the speculative-sampling rule itself (d is accepted with probability p(d); after a rejection the token
    follows p with d removed), and a seeded request's tokens are those it gets without speculation."""
    sampled = (probs / noise).argmax(dim=-1).tolist()
    out: list[int] = []
    for d, t in zip(drafts, sampled):
        if d != t:
            break
        out.append(d)
    out.append(sampled[len(out)])
    return out
