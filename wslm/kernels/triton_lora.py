"""Triton batched LoRA delta (punica's BGMV: each token row gathers its own adapter): a shrink kernel
h = x @ A[slot]^T (fp32), then an expand kernel out += h @ B[slot]^T. Rows whose slot is -1 (the base alone)
exit at once. The reference, with the buffer layout, is torch_lora.py."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wslm.kernels import configs


@triton.jit
def _lora_shrink_kernel(
    x_ptr, a_ptr, slot_ptr, h_ptr,
    stride_x, stride_as, stride_ar, stride_h,
    K, R,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    if slot < 0:
        return
    rs = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rs < R
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = ks < K
        x = tl.load(x_ptr + row * stride_x + ks, mask=kmask, other=0.0).to(tl.float32)
        a = tl.load(a_ptr + slot * stride_as + rs[:, None] * stride_ar + ks[None, :],
                    mask=rmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(a * x[None, :], axis=1)
    tl.store(h_ptr + row * stride_h + rs, acc, mask=rmask)


@triton.jit
def _lora_expand_kernel(
    h_ptr, b_ptr, slot_ptr, out_ptr,
    stride_h, stride_bs, stride_bn, stride_o,
    N, R,
    BLOCK_N: tl.constexpr, R_PAD: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    if slot < 0:
        return
    ns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = ns < N
    rs = tl.arange(0, R_PAD)
    rmask = rs < R
    h = tl.load(h_ptr + row * stride_h + rs, mask=rmask, other=0.0)
    b = tl.load(b_ptr + slot * stride_bs + ns[:, None] * stride_bn + rs[None, :],
                mask=nmask[:, None] & rmask[None, :], other=0.0).to(tl.float32)
    delta = tl.sum(b * h[None, :], axis=1)
    ptrs = out_ptr + row * stride_o + ns
    old = tl.load(ptrs, mask=nmask, other=0.0).to(tl.float32)
    tl.store(ptrs, (old + delta).to(out_ptr.dtype.element_ty), mask=nmask)


def lora_delta(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, token_slot: torch.Tensor,
               out: torch.Tensor) -> torch.Tensor:
    """See torch_lora.lora_delta: out += delta in place, out's rows contiguous in their last dim."""
    t, k = x.shape
    r, n = a.shape[1], b.shape[1]
    if t == 0 or r == 0:
        return out
    if x.stride(-1) != 1:
        x = x.contiguous()
    if out.stride(-1) != 1:
        raise ValueError("lora_delta: out must be contiguous in its last dimension")
    a, b = a.contiguous(), b.contiguous()
    slot = token_slot.to(torch.int32).contiguous()
    h = torch.empty((t, r), dtype=torch.float32, device=x.device)
    block_r, block_k, block_n, r_pad, warps = configs.lora_config(k, r, n)
    _lora_shrink_kernel[(t, triton.cdiv(r, block_r))](
        x, a, slot, h, x.stride(0), a.stride(0), a.stride(1), h.stride(0), k, r,
        BLOCK_R=block_r, BLOCK_K=block_k, num_warps=warps,
    )
    _lora_expand_kernel[(t, triton.cdiv(n, block_n))](
        h, b, slot, out, h.stride(0), b.stride(0), b.stride(1), out.stride(0), n, r,
        BLOCK_N=block_n, R_PAD=r_pad, num_warps=warps,
    )
    return out


def compile_launches(dtype: str, cc: tuple[int, int]) -> list:
    """The launches tests/test_kernels_compile.py checks for these kernels (tests/kernel_compile.py): ranks
    up to 3 parts x 64 over the hidden sizes of tests/kernel_compile.py's model shapes."""
    Launch = configs.Launch
    out = []
    for k, r, n in ((576, 48, 576), (4096, 192, 4096), (8192, 64, 8192)):
        block_r, block_k, block_n, r_pad, warps = configs.lora_config(k, r, n)
        out.append(Launch("triton_lora:_lora_shrink_kernel", dtype, (("BLOCK_R", block_r), ("BLOCK_K", block_k)),
                          warps, 1, cc, (("slot_ptr", "i32"), ("h_ptr", "fp32"))))
        out.append(Launch("triton_lora:_lora_expand_kernel", dtype, (("BLOCK_N", block_n), ("R_PAD", r_pad)),
                          warps, 1, cc, (("slot_ptr", "i32"), ("h_ptr", "fp32"))))
    return out
