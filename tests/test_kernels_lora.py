"""The batched LoRA delta kernel (wslm/kernels/triton_lora.py) against its PyTorch reference (torch_lora.py)
and a per-row dense oracle: rows of different adapters, rows of the base (slot -1), ranks below the slot
width. Without CUDA it runs under Triton's interpreter (fp32, tiny shapes)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is imported

import pytest  # noqa: E402

pytest.importorskip("triton")

from wslm.kernels.torch_lora import lora_delta as torch_lora_delta  # noqa: E402
from wslm.kernels.triton_lora import lora_delta as triton_lora_delta  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(t: int, k: int, n: int, slots: int, r: int, dtype=torch.float32):
    gen = torch.Generator().manual_seed(t * 7 + k)
    x = torch.randn(t, k, generator=gen).to(DEVICE, dtype)
    a = torch.randn(slots, r, k, generator=gen).to(DEVICE, dtype)
    b = torch.randn(slots, n, r, generator=gen).to(DEVICE, dtype)
    a[-1, r // 2 :] = 0  # the last slot's adapter has half the rank: zero rows past it, as the worker fills them
    b[-1, :, r // 2 :] = 0
    token_slot = torch.tensor([(i % (slots + 1)) - 1 for i in range(t)], dtype=torch.int32, device=DEVICE)
    out = torch.randn(t, n, generator=gen).to(DEVICE, dtype)
    return x, a, b, token_slot, out


@pytest.mark.parametrize("shape", [(7, 64, 96, 3, 16), (5, 40, 24, 2, 48), (1, 130, 70, 1, 8)])
def test_triton_lora_delta_matches_the_reference_and_the_oracle(shape):
    x, a, b, token_slot, out = _case(*shape)
    want = out.clone()
    for i in range(x.shape[0]):  # the oracle: each row its own adapter's (x A^T) B^T
        s = int(token_slot[i])
        if s >= 0:
            want[i] += (x[i].double() @ a[s].double().T @ b[s].double().T).to(want.dtype)
    ref = torch_lora_delta(x, a, b, token_slot, out.clone())
    got = triton_lora_delta(x, a, b, token_slot, out.clone())
    torch.testing.assert_close(ref, want, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-4)
    base = token_slot < 0
    assert torch.equal(got[base], out[base])  # rows of the base are left exactly as they were


def test_lora_launches_are_listed_for_the_offline_compile():
    from wslm.kernels.triton_lora import compile_launches

    kernels = {launch.kernel for launch in compile_launches("float16", (8, 0))}
    assert kernels == {"triton_lora:_lora_shrink_kernel", "triton_lora:_lora_expand_kernel"}
