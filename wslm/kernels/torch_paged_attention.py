"""PyTorch paged attention: the reference for the Triton kernels and the engine's CPU path.

Decode sequences (one query token) are served together by one batched gather of their blocks and one
SDPA call with a length mask; longer query runs (prefill, prefill on a cached prefix) go through one
SDPA call each, with a bottom-right aligned causal mask when a cached prefix precedes them."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _gather_kv(cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """cache[blocks] as [num_blocks * block_size, num_kv_heads, head_dim]."""
    return cache.index_select(0, blocks).flatten(0, 1)


def _decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_len: int,
    scale: float,
) -> torch.Tensor:
    """q [B, H, D], one token per sequence -> [B, H, D]."""
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    n_blocks = -(-max_len // block_size)
    blocks = block_tables[:, :n_blocks].reshape(-1).long()
    # One index_select per cache; [B, Hkv, S, D] stays a strided view (SDPA reads it as is).
    k = k_cache.index_select(0, blocks).view(num_seqs, -1, num_kv_heads, head_dim).transpose(1, 2)
    v = v_cache.index_select(0, blocks).view(num_seqs, -1, num_kv_heads, head_dim).transpose(1, 2)
    pos = torch.arange(k.shape[2], device=q.device)
    mask = (pos[None, :] < seq_lens[:, None].to(pos.dtype))[:, None, None, :]  # [B, 1, 1, S]
    # GQA without expanding K/V: the G query heads of a KV head become G query rows of that head.
    qg = q.view(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)
    return out.reshape(num_seqs, num_heads, head_dim)


def _prefill_one(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    blocks_row: torch.Tensor,
    kv_len: int,
    scale: float,
) -> torch.Tensor:
    """q [L, H, D], the last L of kv_len positions -> [L, H, D]."""
    block_size = k_cache.shape[1]
    q_len = q.shape[0]
    n_blocks = -(-kv_len // block_size)
    blocks = blocks_row[:n_blocks].long()
    # 4-D inputs: CPU SDPA takes its flash kernel (GQA included) for them, the slow math path for 3-D.
    k = _gather_kv(k_cache, blocks)[:kv_len].transpose(0, 1)[None]  # [1, Hkv, S, D]
    v = _gather_kv(v_cache, blocks)[:kv_len].transpose(0, 1)[None]
    qh = q.transpose(0, 1)[None]  # [1, H, L, D]
    if q_len == kv_len:
        out = F.scaled_dot_product_attention(qh, k, v, is_causal=True, scale=scale, enable_gqa=True)
    else:
        # Query i sits at absolute position kv_len - q_len + i and sees keys 0..that position.
        qpos = torch.arange(kv_len - q_len, kv_len, device=q.device)
        kpos = torch.arange(kv_len, device=q.device)
        mask = kpos[None, :] <= qpos[:, None]
        out = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """See wslm.kernels.paged_attention."""
    num_seqs = seq_lens.shape[0]
    if out is None:
        out = torch.empty_like(q)
    if q.shape[0] == 0 or num_seqs == 0:
        return out
    if q.shape[0] == num_seqs:  # every sequence has exactly one query token: pure decode
        max_len = int(seq_lens.max())
        out.copy_(_decode(q, k_cache, v_cache, block_tables, seq_lens, max_len, scale))
        return out
    cu = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    q_lens = [cu[i + 1] - cu[i] for i in range(num_seqs)]
    decode_ids = [i for i in range(num_seqs) if q_lens[i] == 1]
    if len(decode_ids) > 1:  # mixed batch: decode rows together, the rest one by one
        idx = torch.tensor(decode_ids, device=q.device)
        rows = torch.tensor([cu[i] for i in decode_ids], device=q.device)
        dl = seq_lens.index_select(0, idx)
        res = _decode(
            q.index_select(0, rows), k_cache, v_cache, block_tables.index_select(0, idx), dl,
            max(lens[i] for i in decode_ids), scale,
        )
        out.index_copy_(0, rows, res.to(out.dtype))
        done = set(decode_ids)
    else:
        done = set()
    for i in range(num_seqs):
        if i in done or q_lens[i] == 0:
            continue
        s, e = cu[i], cu[i + 1]
        out[s:e] = _prefill_one(q[s:e], k_cache, v_cache, block_tables[i], lens[i], scale)
    return out
