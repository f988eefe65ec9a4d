"""Triton matmuls over GGUF block bytes as the file stores them (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
Q6_K).

The weight is a uint8 tensor [rows, bytes_per_row] (the file's layout, no repacking); torch_gguf.py
describes the block layouts and is the reference. Each program dequantizes a tile of weights in
registers: every weight element finds its block, its quant bits and its scale(s) by index arithmetic
(the scale and the shared bytes of a block are re-read per element from L1, the bytes come from DRAM
once), so one tile function `_dequant` serves any tile shape and any K offset.

  _gguf_gemv_kernel  decode, 1..32 activation rows. One row: float32 FMAs of the float32 weights with
                     the activations, reduced at the end. 2..32 rows: tensor-core dots of 16/32 padded
                     rows; for 16-bit activations the float32 weight is split into hi + lo in the
                     activations' dtype (two dots), so the product keeps ~16 bits of each weight and the
                     result stays within float32 rounding of the float32 reference. Split-K over a
                     second grid axis when the output tiles alone cannot fill the GPU; float32 partials
                     [split, M, N] are summed by the wrapper.
  _gguf_gemm_kernel  prefill: [BLOCK_M, BLOCK_K] activations x a dequantized [BLOCK_K, BLOCK_N] weight
                     tile rounded to the activations' dtype, tl.dot with float32 accumulation (the
                     weights rounded once, as a dequantize-then-GEMM would; tf32x3 for float32).

Launch parameters come only from wslm.kernels.configs (gguf_gemv_config, gguf_gemm_config)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wslm.kernels import configs
from wslm.kernels.dispatch import device_capability
from wslm.kernels.torch_gguf import block_format, check_out, weight_shape

# ggml type ids (the QTYPE constexpr)
_Q4_0 = tl.constexpr(2)
_Q4_1 = tl.constexpr(3)
_Q5_0 = tl.constexpr(6)
_Q5_1 = tl.constexpr(7)
_Q8_0 = tl.constexpr(8)
_Q4_K = tl.constexpr(12)
_Q5_K = tl.constexpr(13)
_Q6_K = tl.constexpr(14)


@triton.jit
def _f16_at(ptr, mask):
    """The little-endian half at byte pointer `ptr` (every f16 field sits at an even offset)."""
    return tl.load(ptr.to(tl.pointer_type(tl.float16)), mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _byte_at(ptr, mask):
    return tl.load(ptr, mask=mask, other=0).to(tl.int32)


@triton.jit
def _int8_at(ptr, mask):
    return tl.load(ptr, mask=mask, other=0).to(tl.int8, bitcast=True).to(tl.float32)


@triton.jit
def _dequant(w_ptr, rows, n_mask, k0, k_end, stride_wn,
             QTYPE: tl.constexpr, GROUPS: tl.constexpr, GROUP: tl.constexpr):
    """float32 weights W[rows, k0 + s * GROUP + g] as a [GROUPS, GROUP, BLOCK_N] tile (rows int64 and n_mask
    [1, 1, BLOCK_N]; 0 past N or k_end), bit-equal to torch_gguf.dequantize. A group's weights share
    their scale, so scales and block headers load once per (group, row) and broadcast; the quant bytes load
    per weight. k0 and k_end are multiples of GROUP (K is a multiple of the block size). The products
    d * scale * q are exact in float32, so an FMA that fuses the K-quants' `- dmin * m` rounds the same."""
    s = tl.arange(0, GROUPS)[:, None, None]
    g = tl.arange(0, GROUP)[None, :, None]
    kg = k0 + s * GROUP  # [GROUPS, 1, 1]: the group's first weight
    mask = (kg < k_end) & n_mask  # [GROUPS, 1, BLOCK_N], broadcast over the group's weights
    row = w_ptr + rows * stride_wn
    if QTYPE == _Q4_0:
        base = row + (kg // 32) * 18
        q = (_byte_at(base + 2 + g % 16, mask) >> ((g // 16) * 4)) & 15
        w = _f16_at(base, mask) * (q - 8).to(tl.float32)
    elif QTYPE == _Q4_1:
        base = row + (kg // 32) * 20
        q = (_byte_at(base + 4 + g % 16, mask) >> ((g // 16) * 4)) & 15
        w = _f16_at(base, mask) * q.to(tl.float32) + _f16_at(base + 2, mask)
    elif QTYPE == _Q5_0:
        base = row + (kg // 32) * 22
        q = (_byte_at(base + 6 + g % 16, mask) >> ((g // 16) * 4)) & 15
        q = q | (((_byte_at(base + 2 + g // 8, mask) >> (g % 8)) & 1) << 4)
        w = _f16_at(base, mask) * (q - 16).to(tl.float32)
    elif QTYPE == _Q5_1:
        base = row + (kg // 32) * 24
        q = (_byte_at(base + 8 + g % 16, mask) >> ((g // 16) * 4)) & 15
        q = q | (((_byte_at(base + 4 + g // 8, mask) >> (g % 8)) & 1) << 4)
        w = _f16_at(base, mask) * q.to(tl.float32) + _f16_at(base + 2, mask)
    elif QTYPE == _Q8_0:
        base = row + (kg // 32) * 34
        w = _f16_at(base, mask) * _int8_at(base + 2 + g, mask)
    elif QTYPE == _Q6_K:  # GROUP 16: one int8 scale per 16 weights
        base = row + (kg // 256) * 210
        j = kg % 256 + g  # [GROUPS, GROUP, 1]
        half = j // 128
        r = j % 128
        low = (_byte_at(base + half * 64 + r % 64, mask) >> ((r // 64) * 4)) & 15
        high = (_byte_at(base + 128 + half * 32 + r % 32, mask) >> ((r // 32) * 2)) & 3
        q = (low | (high << 4)) - 32
        scale = _f16_at(base + 208, mask) * _int8_at(base + 192 + (kg % 256) // 16, mask)
        w = scale * q.to(tl.float32)
    else:  # Q4_K, Q5_K: 8 sub-blocks of 32 (= the groups) with 6-bit scales and mins packed in 12 bytes
        if QTYPE == _Q4_K:
            base = row + (kg // 256) * 144
            qs = base + 16
        else:
            base = row + (kg // 256) * 176
            qs = base + 48
        sub = (kg % 256) // 32  # [GROUPS, 1, 1]
        s_lo = _byte_at(base + 4 + sub, mask)  # scale byte `sub` (sub >= 4: low bits of the min's top)
        s_hi = _byte_at(base + 8 + sub, mask)  # byte sub + 4
        s_top = _byte_at(base + 4 + (sub & 3), mask)  # sub >= 4: the byte holding the scale's top 2 bits
        first = sub < 4
        sc = tl.where(first, s_lo & 63, (s_hi & 15) | ((s_top >> 6) << 4))
        mn = tl.where(first, s_hi & 63, (s_hi >> 4) | ((s_lo >> 6) << 4))
        q = (_byte_at(qs + (sub // 2) * 32 + g, mask) >> ((sub % 2) * 4)) & 15
        if QTYPE == _Q5_K:
            q = q | (((_byte_at(base + 16 + g, mask) >> sub) & 1) << 4)
        scale = _f16_at(base, mask) * sc.to(tl.float32)
        w = scale * q.to(tl.float32) - _f16_at(base + 2, mask) * mn.to(tl.float32)
    return w


@triton.jit
def _gguf_gemv_kernel(
    x_ptr, w_ptr, part_ptr,
    M, N, K, stride_xm, stride_wn, k_per_split,
    QTYPE: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, SPLIT_W: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """grid (cdiv(N, BLOCK_N), splits): part[split, m, n] = sum over the split's K range of x[m, k] W[n, k]."""
    GROUPS: tl.constexpr = BLOCK_K // GROUP
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    rows = offs_n.to(tl.int64)[None, None, :]
    n_mask3 = n_mask[None, None, :]
    k_start = pid_k * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    part = part_ptr + pid_k.to(tl.int64) * M * N
    if BLOCK_M == 1:
        acc = tl.zeros([GROUPS, GROUP, BLOCK_N], tl.float32)
        ks = tl.arange(0, GROUPS)[:, None, None] * GROUP + tl.arange(0, GROUP)[None, :, None]
        for k0 in range(k_start, k_end, BLOCK_K):
            w = _dequant(w_ptr, rows, n_mask3, k0, k_end, stride_wn, QTYPE, GROUPS, GROUP)
            x = tl.load(x_ptr + k0 + ks, mask=k0 + ks < k_end, other=0.0).to(tl.float32)
            acc += w * x
        tl.store(part + offs_n, tl.sum(tl.sum(acc, axis=0), axis=0), mask=n_mask)
    else:
        offs_m = tl.arange(0, BLOCK_M)
        m_mask = offs_m < M
        x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None] & (offs_k < k_end)[None, :], other=0.0)
            w = tl.reshape(_dequant(w_ptr, rows, n_mask3, k0, k_end, stride_wn, QTYPE, GROUPS, GROUP),
                           [BLOCK_K, BLOCK_N])
            if SPLIT_W:
                hi = w.to(x.dtype)
                lo = (w - hi.to(tl.float32)).to(x.dtype)
                acc = tl.dot(x, hi, acc)
                acc = tl.dot(x, lo, acc)
            else:
                acc = tl.dot(x, w.to(x.dtype), acc, input_precision=DOT_PRECISION)
        tl.store(part + offs_m[:, None] * N + offs_n[None, :], acc, mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _gguf_gemm_kernel(
    x_ptr, w_ptr, out_ptr,
    M, N, K, stride_xm, stride_wn, stride_om,
    QTYPE: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """grid (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),): out = x @ W.T, programs ordered in groups of GROUP_M row
    tiles so that a weight tile is dequantized for neighbouring row tiles while its bytes are in L2."""
    GROUPS: tl.constexpr = BLOCK_K // GROUP
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    rows = offs_n.to(tl.int64)[None, None, :]
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None] & (offs_k < K)[None, :], other=0.0)
        w = _dequant(w_ptr, rows, n_mask[None, None, :], k0, K, stride_wn, QTYPE, GROUPS, GROUP)
        acc = tl.dot(x, tl.reshape(w, [BLOCK_K, BLOCK_N]).to(x.dtype), acc, input_precision=DOT_PRECISION)
    out = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _gguf_dequant_kernel(
    w_ptr, out_ptr, N, K, stride_wn, stride_on,
    QTYPE: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """grid (cdiv(N, BLOCK_N), cdiv(K, BLOCK_K)): out[n, k] = W[n, k] in float32 (embedding rows, and the
    check that the tile decode is bit-equal to the reference)."""
    GROUPS: tl.constexpr = BLOCK_K // GROUP
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    n_mask = (offs_n < N)[None, None, :]
    rows = offs_n.to(tl.int64)[None, None, :]
    w = _dequant(w_ptr, rows, n_mask, k0, K, stride_wn, QTYPE, GROUPS, GROUP)
    ks = k0 + tl.arange(0, GROUPS)[:, None, None] * GROUP + tl.arange(0, GROUP)[None, :, None]
    tl.store(out_ptr + rows * stride_on + ks, w, mask=n_mask & (ks < K))


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def gguf_matmul(x: torch.Tensor, raw: torch.Tensor, ggml_type: int | str,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """See wslm.kernels.gguf_matmul."""
    fmt = block_format(ggml_type)
    n, k = weight_shape(raw, fmt.name)
    if x.shape[-1] != k:
        raise ValueError(f"gguf_matmul: activations have {x.shape[-1]} features, the {fmt.name} weight {k}")
    if raw.stride(1) != 1:
        raise ValueError("gguf_matmul (triton): the block bytes of a row must be contiguous")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    check_out(out, m, n, x.dtype)
    if m == 0 or n == 0:
        return x.new_zeros(*lead, n) if out is None else out
    dtype = _dtype_name(x)
    cap = device_capability(x.device)
    if m <= configs.GGUF_GEMV_MAX_ROWS:
        cfg = configs.gguf_gemv_config(fmt.name, dtype, m, n, k, cap)
        k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
        splits = triton.cdiv(k, k_per_split)
        part = torch.empty(splits, m, n, dtype=torch.float32, device=x.device)
        _gguf_gemv_kernel[(triton.cdiv(n, cfg.block_n), splits)](
            x2, raw, part, m, n, k, x2.stride(0), raw.stride(0), k_per_split,
            QTYPE=fmt.type_id, GROUP=fmt.scale_group, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            SPLIT_W=cfg.split_w, DOT_PRECISION=cfg.dot_precision,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, maxnreg=cfg.maxnreg,
        )
        y = part[0] if splits == 1 else part.sum(0)
        if out is not None:
            return out.copy_(y)
        return y.to(x.dtype).reshape(*lead, n)
    cfg = configs.gguf_gemm_config(fmt.name, dtype, m, n, k, cap)
    y = torch.empty(m, n, dtype=x.dtype, device=x.device) if out is None else out
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    _gguf_gemm_kernel[grid](
        x2, raw, y, m, n, k, x2.stride(0), raw.stride(0), y.stride(0),
        QTYPE=fmt.type_id, GROUP=fmt.scale_group, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m, DOT_PRECISION=cfg.dot_precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, maxnreg=cfg.maxnreg,
    )
    return y if out is not None else y.reshape(*lead, n)


def gguf_dequantize(raw: torch.Tensor, ggml_type: int | str) -> torch.Tensor:
    """See wslm.kernels.gguf_dequantize."""
    fmt = block_format(ggml_type)
    n, k = weight_shape(raw, fmt.name)
    if raw.stride(1) != 1:
        raise ValueError("gguf_dequantize (triton): the block bytes of a row must be contiguous")
    out = torch.empty(n, k, dtype=torch.float32, device=raw.device)
    if n == 0:
        return out
    block_n, block_k, warps = configs.gguf_dequant_config(fmt.name)
    _gguf_dequant_kernel[(triton.cdiv(n, block_n), triton.cdiv(k, block_k))](
        raw, out, n, k, raw.stride(0), out.stride(0), QTYPE=fmt.type_id, GROUP=fmt.scale_group, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=warps,
    )
    return out


# Shapes the compile check plans for (configs differ by rows only; N and K set the split, a runtime value).
_COMPILE_ROWS_GEMV = (1, 8, 32)
_COMPILE_ROWS_GEMM = (64, 512)


def compile_launches(dtype: str, cc: tuple[int, int]) -> list:
    """The launches tests/kernel_compile.py checks for these kernels: every tile the config functions pick
    for each block type (rows 1 / 2-16 / 17-32 for the GEMV, short and long prefills for the GEMM)."""
    from wslm.kernels.torch_gguf import FORMATS

    Launch = configs.Launch
    ptrs = (("w_ptr", "u8"), ("part_ptr", "fp32"))
    out = []
    for fmt in FORMATS.values():
        for rows in _COMPILE_ROWS_GEMV:
            c = configs.gguf_gemv_config(fmt.name, dtype, rows, 4096, 4096, cc)
            consts = (("QTYPE", fmt.type_id), ("GROUP", fmt.scale_group), ("BLOCK_M", c.block_m), ("BLOCK_N", c.block_n),
                      ("BLOCK_K", c.block_k), ("SPLIT_W", c.split_w), ("DOT_PRECISION", c.dot_precision))
            out.append(Launch("triton_gguf:_gguf_gemv_kernel", dtype, consts, c.num_warps, c.num_stages, cc, ptrs,
                              maxnreg=c.maxnreg))
        for rows in _COMPILE_ROWS_GEMM:
            c = configs.gguf_gemm_config(fmt.name, dtype, rows, 4096, 4096, cc)
            consts = (("QTYPE", fmt.type_id), ("GROUP", fmt.scale_group), ("BLOCK_M", c.block_m), ("BLOCK_N", c.block_n),
                      ("BLOCK_K", c.block_k), ("GROUP_M", c.group_m), ("DOT_PRECISION", c.dot_precision))
            out.append(Launch("triton_gguf:_gguf_gemm_kernel", dtype, consts, c.num_warps, c.num_stages, cc,
                              ptrs[:1], maxnreg=c.maxnreg))
        block_n, block_k, warps = configs.gguf_dequant_config(fmt.name)
        consts = (("QTYPE", fmt.type_id), ("GROUP", fmt.scale_group), ("BLOCK_N", block_n), ("BLOCK_K", block_k))
        out.append(Launch("triton_gguf:_gguf_dequant_kernel", dtype, consts, warps, 1, cc,
                          (("w_ptr", "u8"), ("out_ptr", "fp32"))))
    return out
