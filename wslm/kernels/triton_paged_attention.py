"""Triton paged attention: one FlashAttention-2 style kernel for any mix of prefill, prefill on a cached
prefix and decode, and a split-KV (flash-decoding) kernel with a reduce pass when every query length is 1.

Both read K/V straight from the paged cache: a tile of BLOCK_N key positions looks up each position's
physical block in the block table, so tiles need not match the cache's block size. Softmax is online in
base 2 (scale folded into log2 e) with fp32 statistics and accumulators; fp16/bf16 inputs go through
tl.dot with fp32 accumulation. Imported only when the triton backend runs (wslm.kernels.dispatch).

Options, each a constexpr so the plain kernels stay as they were: SLIDING (keys after position - window;
tiles and partitions wholly before the window are never visited), SOFT_CAP (cap * tanh(score / cap)),
HAS_SINKS (a per-head logit in the softmax's denominator: it seeds the running max and sum, in the first
partition only when the KV axis is split)."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from wslm.kernels import configs
from wslm.kernels.dispatch import device_capability

LOG2E = 1.4426950408889634


@triton.jit
def _load_kv_tile(
    cache_ptr, block_table_row, offs_n, offs_d, n_mask, d_mask,
    stride_b, stride_s, kv_head_off,
    BLOCK_SIZE: tl.constexpr,
):
    """[BLOCK_N, HEAD_DIM_PAD] keys or values at logical positions offs_n of one sequence and KV head."""
    phys = tl.load(block_table_row + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    rows = phys * stride_b + (offs_n % BLOCK_SIZE) * stride_s + kv_head_off
    return tl.load(cache_ptr + rows[:, None] + offs_d[None, :], mask=n_mask[:, None] & d_mask[None, :], other=0.0)


@triton.jit
def _tanh(x):
    # exp2-based and sign-symmetric: no overflow for large |x|, full fp32 accuracy near 0 is not needed
    # (scores are capped, not differentiated).
    e = tl.exp2(-2.8853900817779268 * tl.abs(x))  # exp(-2|x|)
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _init_stats(sinks_ptr, heads, valid, ROWS: tl.constexpr, HAS_SINKS: tl.constexpr):
    """Running max (log2 domain) and sum: empty, or seeded by the heads' sink logits."""
    if HAS_SINKS:
        m_i = tl.load(sinks_ptr + heads, mask=valid, other=float("-inf")).to(tl.float32) * 1.4426950408889634
        l_i = tl.where(m_i == float("-inf"), 0.0, 1.0)
    else:
        m_i = tl.full([ROWS], float("-inf"), tl.float32)
        l_i = tl.zeros([ROWS], tl.float32)
    return m_i, l_i


@triton.jit
def _attend_tile(
    acc, m_i, l_i, q, start_n,
    k_cache_ptr, v_cache_ptr, block_table_row, offs_d, d_mask, q_pos, kv_end,
    stride_kb, stride_ks, k_head_off, stride_vb, stride_vs, v_head_off,
    qk_scale, cap_log2, window,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr,
    SLIDING: tl.constexpr, SOFT_CAP: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """One online-softmax step of query rows q [M, D] over keys start_n .. start_n + BLOCK_N.
    MASK: 0 every key visible (interior tiles), 1 keys below kv_end, 2 also causal (key <= q_pos);
    SLIDING adds key > q_pos - window. Scores end in the log2 domain: q.k * qk_scale, or with SOFT_CAP
    cap_log2 * tanh(q.k * qk_scale) (the wrapper folds 1/cap into qk_scale and log2 e into cap_log2)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    n_mask = offs_n < kv_end
    k = _load_kv_tile(k_cache_ptr, block_table_row, offs_n, offs_d, n_mask, d_mask,
                      stride_kb, stride_ks, k_head_off, BLOCK_SIZE)
    v = _load_kv_tile(v_cache_ptr, block_table_row, offs_n, offs_d, n_mask, d_mask,
                      stride_vb, stride_vs, v_head_off, BLOCK_SIZE)
    s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PRECISION) * qk_scale  # [M, BLOCK_N]
    if SOFT_CAP:
        s = cap_log2 * _tanh(s)
    if SLIDING:
        s = tl.where(offs_n[None, :] > q_pos[:, None] - window, s, float("-inf"))
    if MASK == 2:
        s = tl.where((offs_n[None, :] <= q_pos[:, None]) & n_mask[None, :], s, float("-inf"))
    elif MASK == 1:
        s = tl.where(n_mask[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that have seen nothing yet stay at 0
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    block_tables_ptr, cu_seqlens_q_ptr, seq_lens_ptr, sinks_ptr,
    qk_scale, cap_log2, window,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_bt,
    NUM_GROUPS: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    SLIDING: tl.constexpr, SOFT_CAP: tl.constexpr, HAS_SINKS: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """grid (num_seqs, cdiv(max_q_len, BLOCK_Q), num_kv_heads), BLOCK_Q = BLOCK_M // GROUP_PAD.

    The BLOCK_M rows of a program are BLOCK_Q query tokens x the GROUP_PAD query heads of one KV head
    (row r: token r // GROUP_PAD, head r % GROUP_PAD), so each K/V tile is read once per GQA group and
    a decode sequence in a mixed batch wastes few rows."""
    seq = tl.program_id(0)
    q_block = tl.program_id(1)
    kv_head = tl.program_id(2)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    m0 = q_block * BLOCK_Q  # first query token of this program
    if m0 >= q_len:
        return
    kv_len = tl.load(seq_lens_ptr + seq)
    ctx = kv_len - q_len  # cached prefix: query token m sits at position ctx + m

    rows = tl.arange(0, BLOCK_M)
    tok = m0 + rows // GROUP_PAD
    g = rows % GROUP_PAD
    head = kv_head * NUM_GROUPS + g
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    row_mask = (tok < q_len) & (g < NUM_GROUPS)
    d_mask = offs_d < HEAD_DIM
    q_rows = (q_start + tok).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_mask[:, None] & d_mask[None, :], other=0.0)
    q_pos = ctx + tok

    m_i, l_i = _init_stats(sinks_ptr, head, g < NUM_GROUPS, BLOCK_M, HAS_SINKS)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    block_table_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    k_head_off = kv_head * stride_kh
    v_head_off = kv_head * stride_vh

    # Keys below ctx + m0 + 1 are visible to every row of this tile: no causal mask there.
    full_end = ((ctx + m0 + 1) // BLOCK_N) * BLOCK_N
    lo = 0
    if SLIDING:  # the first row sees keys from ctx + m0 + 1 - window on; later rows see fewer
        lo = (tl.maximum(ctx + m0 + 1 - window, 0) // BLOCK_N) * BLOCK_N
    for start_n in range(lo, full_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, start_n, k_cache_ptr, v_cache_ptr, block_table_row, offs_d, d_mask,
            q_pos, kv_len, stride_kb, stride_ks, k_head_off, stride_vb, stride_vs, v_head_off,
            qk_scale, cap_log2, window, BLOCK_SIZE, BLOCK_N, 0, SLIDING, SOFT_CAP, DOT_PRECISION,
        )
    kv_end = tl.minimum(kv_len, ctx + m0 + BLOCK_Q)
    for start_n in range(full_end, kv_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, start_n, k_cache_ptr, v_cache_ptr, block_table_row, offs_d, d_mask,
            q_pos, kv_len, stride_kb, stride_ks, k_head_off, stride_vb, stride_vs, v_head_off,
            qk_scale, cap_log2, window, BLOCK_SIZE, BLOCK_N, 2, SLIDING, SOFT_CAP, DOT_PRECISION,
        )
    acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask[None, :])


@triton.jit
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, part_out_ptr, part_lse_ptr,
    block_tables_ptr, seq_lens_ptr, sinks_ptr,
    qk_scale, cap_log2, window, partition_size,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_bt, stride_ps, stride_ph,
    NUM_GROUPS: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
    SINGLE_PARTITION: tl.constexpr, SLIDING: tl.constexpr, SOFT_CAP: tl.constexpr, HAS_SINKS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """grid (num_seqs, num_kv_heads, num_partitions): every query head of one KV head (GQA group) over
    one partition of the sequence's keys, so each K/V byte is read once per group. With one partition
    it writes the output; otherwise the normalised partial output and its log2-sum-exp for the reduce.
    With SLIDING the partitions tile the window (keys kv_len - window .. kv_len), not the whole sequence,
    so starting there needs no window mask."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)
    kv_len = tl.load(seq_lens_ptr + seq)
    lo = 0
    if SLIDING:
        lo = tl.maximum(kv_len - window, 0)
    start = lo + part * partition_size
    if start >= kv_len:
        return
    end = tl.minimum(start + partition_size, kv_len)

    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    g_mask = offs_g < NUM_GROUPS
    d_mask = offs_d < HEAD_DIM
    heads = kv_head * NUM_GROUPS + offs_g
    q = tl.load(q_ptr + seq.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)
    sink_rows = tl.where(part == 0, NUM_GROUPS, 0)  # the sinks join the first partition's sum only
    m_i, l_i = _init_stats(sinks_ptr, heads, offs_g < sink_rows, GROUP_PAD, HAS_SINKS)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], tl.float32)
    block_table_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for start_n in range(start, end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, start_n, k_cache_ptr, v_cache_ptr, block_table_row, offs_d, d_mask,
            offs_g, end, stride_kb, stride_ks, kv_head * stride_kh, stride_vb, stride_vs,
            kv_head * stride_vh, qk_scale, cap_log2, window, BLOCK_SIZE, BLOCK_N, 1, False, SOFT_CAP,
            DOT_PRECISION,
        )
    acc = acc / l_i[:, None]
    mask = g_mask[:, None] & d_mask[None, :]
    if SINGLE_PARTITION:
        tl.store(out_ptr + seq.to(tl.int64) * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
                 acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        base = seq.to(tl.int64) * stride_ps + heads * stride_ph + part  # part_lse [B, H, P]
        tl.store(part_lse_ptr + base, m_i + tl.log2(l_i), mask=g_mask)
        tl.store(part_out_ptr + base[:, None] * HEAD_DIM_PAD + offs_d[None, :], acc, mask=mask)


@triton.jit
def _decode_reduce_kernel(
    out_ptr, part_out_ptr, part_lse_ptr, seq_lens_ptr,
    partition_size, window, stride_ot, stride_oh, stride_ps, stride_ph,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, PARTS_BLOCK: tl.constexpr, SLIDING: tl.constexpr,
):
    """grid (num_seqs, num_heads): merges the partitions' partial outputs by their log-sum-exp,
    PARTS_BLOCK partitions at a time (an online merge: registers stay bounded however many there are)."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    kv_len = tl.load(seq_lens_ptr + seq)
    span = kv_len
    if SLIDING:
        span = tl.minimum(kv_len, window)
    num_parts = tl.cdiv(span, partition_size)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    row = seq.to(tl.int64) * stride_ps + head * stride_ph
    m = tl.max(tl.full([PARTS_BLOCK], float("-inf"), tl.float32), 0)
    den = tl.sum(tl.zeros([PARTS_BLOCK], tl.float32), 0)
    acc = tl.zeros([HEAD_DIM_PAD], tl.float32)
    for p0 in range(0, num_parts, PARTS_BLOCK):
        offs_p = p0 + tl.arange(0, PARTS_BLOCK)
        p_mask = offs_p < num_parts
        lse = tl.load(part_lse_ptr + row + offs_p, mask=p_mask, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(lse, 0))  # partition 0 is never empty: m_new is finite
        alpha = tl.exp2(m - m_new)
        w = tl.where(p_mask, tl.exp2(lse - m_new), 0.0)
        parts = tl.load(part_out_ptr + (row + offs_p)[:, None] * HEAD_DIM_PAD + offs_d[None, :],
                        mask=p_mask[:, None], other=0.0)
        acc = acc * alpha + tl.sum(parts * w[:, None], 0)
        den = den * alpha + tl.sum(w, 0)
        m = m_new
    tl.store(out_ptr + seq.to(tl.int64) * stride_ot + head * stride_oh + offs_d,
             (acc / den).to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8  # the interpreter: keep grids small


def _check(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, out) -> None:
    if q.dim() != 3 or k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"paged_attention wants q [T, H, D] and caches [blocks, block_size, Hkv, D]; got q "
            f"{tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}"
        )
    if q.shape[2] != k_cache.shape[3] or q.shape[1] % k_cache.shape[2]:
        raise ValueError(
            f"paged_attention: head_dim {q.shape[2]} vs {k_cache.shape[3]}, or {q.shape[1]} query heads "
            f"not a multiple of {k_cache.shape[2]} KV heads"
        )
    if q.stride(2) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1 or out.stride(2) != 1:
        raise ValueError("paged_attention (triton): the head_dim axis of q, out and the caches must be contiguous")
    for name, t in (("block_tables", block_tables), ("cu_seqlens_q", cu_seqlens_q), ("seq_lens", seq_lens)):
        if t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"paged_attention: {name} must be int32, got {t.dtype}")
    if block_tables.stride(-1) != 1:
        raise ValueError("paged_attention (triton): block_tables rows must be contiguous")


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    *,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    partition_size: int | None = None,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """See wslm.kernels.paged_attention. partition_size (a multiple of 64) forces the decode split.

    Decode launches depend only on shapes and max_seqlen_k (grid, partition buffers), never on tensor
    values, so a CUDA graph captured with a fixed max_seqlen_k (e.g. max_model_len) replays correctly
    for any seq_lens up to it. The prefill path needs max_seqlen_q (or reads it with a device sync)."""
    if out is None:
        out = torch.empty_like(q)
    _check(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, out)
    num_tokens, num_heads, head_dim = q.shape
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    groups = num_heads // num_kv_heads
    head_dim_pad = triton.next_power_of_2(head_dim)
    if logits_soft_cap:
        qk_scale, cap_log2 = float(scale) / logits_soft_cap, float(logits_soft_cap) * LOG2E
    else:
        qk_scale, cap_log2 = float(scale) * LOG2E, 0.0
    window = int(sliding_window) if sliding_window else 0
    if sinks is not None and (sinks.shape != (num_heads,) or sinks.device != q.device):
        raise ValueError(f"paged_attention: sinks must be [{num_heads}] on {q.device}, got "
                         f"{tuple(sinks.shape)} on {sinks.device}")
    options = dict(SLIDING=window > 0, SOFT_CAP=bool(logits_soft_cap), HAS_SINKS=sinks is not None)
    sinks_arg = sinks if sinks is not None else seq_lens  # unused when HAS_SINKS is off
    common_strides = (
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
    )
    dtype = str(q.dtype).removeprefix("torch.")
    capability = device_capability(q.device)

    if num_tokens == num_seqs:  # one query token per sequence: decode
        cfg = configs.decode_config(dtype, head_dim, groups, capability)
        block_n = configs.PARTITION_UNIT  # partitions are multiples of it (cfg.block_n divides it)
        # An upper bound on every seq_len; the block table's width always is one (0/None: unknown).
        max_len = max_seqlen_k if max_seqlen_k else block_tables.shape[1] * block_size
        if window:  # partitions tile the window only
            max_len = min(max_len, window)
        if partition_size is None:
            programs = num_seqs * num_kv_heads
            target = 2 * _num_sms(q.device)
            splits = min(-(-target // programs), -(-max_len // 256)) if programs < target else 1
            partition_size = -(-max(1, -(-max_len // max(splits, 1))) // block_n) * block_n
        elif partition_size % block_n:
            raise ValueError(f"partition_size must be a multiple of {block_n}, got {partition_size}")
        num_parts = max(1, -(-max_len // partition_size))
        single = num_parts == 1
        if single:
            partition_size = 1 << 30  # the whole sequence, whatever its length
            part_out = part_lse = out  # unused
            stride_ps = stride_ph = 0
        else:
            part_lse = torch.empty(num_seqs, num_heads, num_parts, device=q.device, dtype=torch.float32)
            part_out = torch.empty(num_seqs, num_heads, num_parts, head_dim_pad, device=q.device,
                                   dtype=torch.float32)
            stride_ps, stride_ph = part_lse.stride(0), part_lse.stride(1)
        _decode_kernel[(num_seqs, num_kv_heads, num_parts)](
            q, k_cache, v_cache, out, part_out, part_lse, block_tables, seq_lens, sinks_arg,
            qk_scale, cap_log2, window, partition_size, *common_strides, stride_ps, stride_ph,
            NUM_GROUPS=groups, GROUP_PAD=cfg.group_pad, BLOCK_SIZE=block_size,
            HEAD_DIM=head_dim, HEAD_DIM_PAD=cfg.head_dim_pad, BLOCK_N=cfg.block_n, SINGLE_PARTITION=single,
            **options, DOT_PRECISION=cfg.dot_precision, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        if not single:
            red = configs.decode_reduce_config(head_dim)
            _decode_reduce_kernel[(num_seqs, num_heads)](
                out, part_out, part_lse, seq_lens, partition_size, window,
                out.stride(0), out.stride(1), stride_ps, stride_ph,
                HEAD_DIM=head_dim, HEAD_DIM_PAD=red.head_dim_pad, PARTS_BLOCK=red.parts_block,
                SLIDING=window > 0, num_warps=red.num_warps,
            )
        return out

    if not max_seqlen_q:
        max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())  # a device sync
    cfg = configs.prefill_config(dtype, head_dim, groups, max_seqlen_q, capability)
    block_q = cfg.block_m // cfg.group_pad
    grid = (num_seqs, math.ceil(max_seqlen_q / block_q), num_kv_heads)
    _prefill_kernel[grid](
        q, k_cache, v_cache, out, block_tables, cu_seqlens_q, seq_lens, sinks_arg,
        qk_scale, cap_log2, window, *common_strides,
        NUM_GROUPS=groups, GROUP_PAD=cfg.group_pad, BLOCK_SIZE=block_size, HEAD_DIM=head_dim,
        HEAD_DIM_PAD=cfg.head_dim_pad, BLOCK_M=cfg.block_m, BLOCK_Q=block_q, BLOCK_N=cfg.block_n,
        **options, DOT_PRECISION=cfg.dot_precision, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        maxnreg=cfg.maxnreg,
    )
    return out
