"""Triton mixture-of-experts: a grouped GEMM over (token, expert) pairs sorted by expert (vLLM's
fused_moe layout, simplified).

`_align` sorts the pairs by expert and pads each expert's run to a multiple of BLOCK_M with a sentinel,
entirely on the device (no host sync, so the launch shapes depend on num_tokens only); each program of
`_moe_gemm_kernel` then multiplies BLOCK_M rows of one expert by a BLOCK_N slice of that expert's weight.
It runs twice: gate|up (rows gathered from the tokens), then down (rows of the activations, scaled by
the routing weights), and the top-k partial outputs of each token are summed."""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from wslm.kernels import configs
from wslm.kernels.dispatch import device_capability


@triton.jit
def _moe_gemm_kernel(
    a_ptr, b_ptr, c_ptr, weights_ptr, sorted_ids_ptr, block_expert_ptr,
    num_valid, N, K,
    stride_am, stride_be, stride_bn, stride_cm,
    TOP_K: tl.constexpr, A_PER_SLOT: tl.constexpr, MUL_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """grid (max_blocks, cdiv(N, BLOCK_N)): C[slot] = A[row(slot)] @ B[expert].T (x routing weight).
    slot = token * TOP_K + k indexes the pairs; A's row is the slot (A_PER_SLOT) or its token."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if expert < 0:  # a block past the last expert's padded run
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slots = tl.load(sorted_ids_ptr + offs_m)
    m_mask = slots < num_valid
    if A_PER_SLOT:
        rows = slots.to(tl.int64)
    else:
        rows = (slots // TOP_K).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    b_base = b_ptr + expert * stride_be + offs_n[None, :].to(tl.int64) * stride_bn
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        a = tl.load(a_ptr + rows[:, None] * stride_am + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :],
                    other=0.0)
        b = tl.load(b_base + offs_k[:, None], mask=k_mask[:, None] & n_mask[None, :], other=0.0)  # [K, N]
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    if MUL_WEIGHT:
        # The expert's output is rounded to the model dtype before the routing weight, as HF does.
        w = tl.load(weights_ptr + slots, mask=m_mask, other=0.0)
        acc = acc.to(c_ptr.dtype.element_ty).to(tl.float32) * w.to(tl.float32)[:, None]
    tl.store(c_ptr + slots[:, None].to(tl.int64) * stride_cm + offs_n[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=m_mask[:, None] & n_mask[None, :])


def _align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted_ids [max_blocks * block_m], block_expert [max_blocks]): pair slots grouped by expert, each
    expert's run padded to block_m with the sentinel T * top_k; blocks past the last run get expert -1."""
    flat = topk_ids.reshape(-1).to(torch.int64)
    num_valid = flat.numel()
    max_blocks = triton.cdiv(num_valid, block_m) + min(num_experts, num_valid)
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    ends_padded = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)
    expert_of = flat[order]
    rank = torch.arange(num_valid, device=flat.device) - (torch.cumsum(counts, 0) - counts)[expert_of]
    sorted_ids = torch.full((max_blocks * block_m,), num_valid, dtype=torch.int32, device=flat.device)
    sorted_ids[(ends_padded - padded)[expert_of] + rank] = order.to(torch.int32)
    starts = torch.arange(max_blocks, device=flat.device) * block_m
    block_expert = torch.searchsorted(ends_padded, starts, right=True)
    block_expert = torch.where(block_expert >= num_experts, -1, block_expert).to(torch.int32)
    return sorted_ids, block_expert


def _gemm(a, b, c, weights, sorted_ids, block_expert, top_k, per_slot, mul, cfg) -> None:
    n, k = b.shape[1], b.shape[2]
    grid = (block_expert.shape[0], triton.cdiv(n, cfg.block_n))
    _moe_gemm_kernel[grid](
        a, b, c, weights, sorted_ids, block_expert, c.shape[0], n, k,
        a.stride(0), b.stride(0), b.stride(1), c.stride(0),
        TOP_K=top_k, A_PER_SLOT=per_slot, MUL_WEIGHT=mul,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, DOT_PRECISION=cfg.dot_precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, maxnreg=cfg.maxnreg,
    )


def fused_moe(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    act_and_mul: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """See wslm.kernels.fused_moe."""
    num_tokens, top_k = topk_ids.shape
    hidden_size = hidden.shape[1]
    if num_tokens == 0:
        return torch.zeros_like(hidden)
    for name, t in (("hidden", hidden), ("w13", w13), ("w2", w2)):
        if t.stride(-1) != 1:
            raise ValueError(f"fused_moe (triton): the last axis of {name} must be contiguous")
    dtype = str(hidden.dtype).removeprefix("torch.")
    cfg = configs.moe_config(dtype, num_tokens, top_k, device_capability(hidden.device))
    sorted_ids, block_expert = _align(topk_ids, w13.shape[0], cfg.block_m)
    weights = topk_weights.reshape(-1).contiguous()
    inter = torch.empty(num_tokens * top_k, w13.shape[1], dtype=hidden.dtype, device=hidden.device)
    _gemm(hidden, w13, inter, weights, sorted_ids, block_expert, top_k, False, False, cfg)
    act = act_and_mul(inter)
    if act.stride(-1) != 1:
        act = act.contiguous()
    out = torch.empty(num_tokens * top_k, hidden_size, dtype=hidden.dtype, device=hidden.device)
    _gemm(act, w2, out, weights, sorted_ids, block_expert, top_k, True, True, cfg)
    return out.view(num_tokens, top_k, hidden_size).sum(dim=1)


def compile_launches(dtype: str, cc: tuple[int, int]) -> list:
    """The launches tests/test_kernels_compile.py checks for this kernel (tests/kernel_compile.py)."""
    Launch = configs.Launch
    out = []
    for num_tokens in (1, 512):
        cfg = configs.moe_config(dtype, num_tokens, 8, cc)
        for per_slot, mul in ((False, False), (True, True)):
            consts = (("TOP_K", 8), ("A_PER_SLOT", per_slot), ("MUL_WEIGHT", mul), ("BLOCK_M", cfg.block_m),
                      ("BLOCK_N", cfg.block_n), ("BLOCK_K", cfg.block_k), ("DOT_PRECISION", cfg.dot_precision))
            ints = (("sorted_ids_ptr", "i32"), ("block_expert_ptr", "i32"))  # weights: the model dtype
            out.append(Launch("triton_moe:_moe_gemm_kernel", dtype, consts, cfg.num_warps, cfg.num_stages, cc, ints,
                              maxnreg=cfg.maxnreg))
    return out
