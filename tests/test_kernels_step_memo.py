"""step_memo: a value computed by the first layer of a step is reused by the others, and never outlives the
step's tensors or an in-place change to them."""

import torch

from wslm.kernels.step_memo import step_memo
from wslm.kernels.torch_rotary import rotary_embedding


def test_reused_for_the_same_tensors_only():
    calls = []

    def build(t):
        calls.append(1)
        return int(t.sum())

    a = torch.tensor([1, 2])
    assert step_memo(("t",), (a,), lambda: build(a)) == 3
    assert step_memo(("t",), (a,), lambda: build(a)) == 3 and len(calls) == 1
    a.add_(1)  # written in place: its version counter moved
    assert step_memo(("t",), (a,), lambda: build(a)) == 5 and len(calls) == 2
    b = torch.tensor([1, 2])  # equal values, another step's tensor
    assert step_memo(("t",), (b,), lambda: build(b)) == 3 and len(calls) == 3
    with torch.inference_mode():
        c = torch.tensor([4])
        assert step_memo(("t",), (c,), lambda: build(c)) == 4
        assert step_memo(("t",), (c,), lambda: build(c)) == 4 and len(calls) == 4


def test_rotary_on_neighbouring_q_k_slices_matches_separate_tensors():
    """q and k as column slices of one fused qkv output rotate in one go; same result as apart."""
    torch.manual_seed(0)
    cache = torch.randn(64, 32)
    positions = torch.tensor([3, 9, 17])
    qkv = torch.randn(3, 4 * 32 + 2 * 2 * 32)
    q, k, _ = qkv.split([128, 64, 64], dim=-1)
    ref_q, ref_k = rotary_embedding(positions, q.clone(), k.clone(), cache, 32)
    out_q, out_k = rotary_embedding(positions, q, k, cache, 32)
    assert out_q.data_ptr() == qkv.data_ptr()  # in place, in the fused buffer
    torch.testing.assert_close(out_q, ref_q, rtol=0, atol=0)
    torch.testing.assert_close(out_k, ref_k, rtol=0, atol=0)
