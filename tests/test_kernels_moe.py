"""fused_moe: the grouped PyTorch experts against a naive per-token loop, and the Triton grouped GEMM
against both (under TRITON_INTERPRET=1 on CPU, tiny shapes; compiled on a CUDA machine)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is imported

import pytest  # noqa: E402

from wslm.kernels import fused_moe  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def _problem(num_tokens, num_experts, top_k, hidden=32, inter=24, seed=0, skew=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=g)
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=g) * 0.2
    w2 = torch.randn(num_experts, hidden, inter, generator=g) * 0.2
    logits = torch.randn(num_tokens, num_experts, generator=g)
    if skew:  # most tokens pick experts 0 and 1: long runs for some experts, none for others
        logits[:, :2] += 4
    weights, ids = torch.topk(logits.softmax(-1), top_k, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    return [t.to(DEVICE) for t in (x, w13, w2, weights, ids)]


def _naive(x, w13, w2, weights, ids):
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            out[t] += weights[t, j] * (silu_and_mul(x[t] @ w13[e].t()) @ w2[e].t())
    return out


@pytest.mark.parametrize(
    "num_tokens, num_experts, top_k, skew",
    [(1, 8, 2, False), (7, 8, 2, False), (70, 8, 4, True), (3, 5, 5, False)],
    ids=["one-token", "decode-batch", "prefill-skewed", "all-experts"],
)
def test_fused_moe_matches_naive(num_tokens, num_experts, top_k, skew):
    args = _problem(num_tokens, num_experts, top_k, skew=skew)
    want = _naive(*args)
    torch.testing.assert_close(fused_moe(*args, silu_and_mul, backend="torch"), want, atol=1e-5, rtol=1e-5)
    pytest.importorskip("triton")
    torch.testing.assert_close(fused_moe(*args, silu_and_mul, backend="triton"), want, atol=1e-5, rtol=1e-5)


def test_fused_moe_no_tokens_and_alignment():
    pytest.importorskip("triton")
    from wslm.kernels.triton_moe import _align

    ids = torch.tensor([[2, 0], [2, 1], [0, 2]], device=DEVICE)
    sorted_ids, block_expert = _align(ids, 4, 4)
    # Expert 0: slots 1, 4; expert 1: slot 3; expert 2: slots 0, 2, 5; each run padded to 4 with 6.
    assert sorted_ids.tolist()[:12] == [1, 4, 6, 6, 3, 6, 6, 6, 0, 2, 5, 6]
    assert block_expert.tolist()[:3] == [0, 1, 2] and all(e == -1 for e in block_expert.tolist()[3:])
    x, w13, w2, weights, ids = _problem(0, 4, 2)
    for backend in ("torch", "triton"):
        assert fused_moe(x, w13, w2, weights, ids, silu_and_mul, backend=backend).shape == (0, 32)
