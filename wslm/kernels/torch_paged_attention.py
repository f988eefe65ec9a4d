"""PyTorch paged attention: the reference for the Triton kernels and the engine's CPU path.

Decode sequences (one query token) are served together by one batched gather of their blocks and one
SDPA call with a length mask; longer query runs (prefill, prefill on a cached prefix) go through one
SDPA call each, with a bottom-right aligned causal mask when a cached prefix precedes them.

Options (see wslm.kernels.paged_attention): a sliding window only changes the mask (SDPA still runs);
a logit soft cap or attention sinks need the scores themselves, so those calls take `_attend_math`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from wslm.kernels.step_memo import step_memo


def _gather_kv(cache: torch.Tensor, blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """cache[blocks] as [num_blocks * block_size, num_kv_heads, head_dim] in `dtype` (an fp8 cache, from
    --kv-cache-dtype fp8, widens to the queries' dtype here, after the gather: only the rows read)."""
    rows = cache.index_select(0, blocks).flatten(0, 1)
    return rows if rows.dtype == dtype else rows.to(dtype)


def _attend_math(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    soft_cap: float | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Explicit attention in fp32 with GQA folded: q [B, Hkv, G, L, D], k/v [B, Hkv, S, D], mask
    broadcastable to [B, Hkv, G, L, S], sinks [Hkv, G] -> [B, Hkv, G, L, D] in q's dtype."""
    scores = torch.einsum("bhgld,bhsd->bhgls", q.float(), k.float()) * scale
    if soft_cap:
        scores = soft_cap * torch.tanh(scores / soft_cap)
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        # gpt-oss: one learned logit per head joins the softmax's denominator and attends to nothing.
        sink = sinks.float()[None, :, :, None, None].expand(*scores.shape[:-1], 1)
        probs = torch.cat((scores, sink), dim=-1).softmax(-1)[..., :-1]
    else:
        probs = scores.softmax(-1)
    return torch.einsum("bhgls,bhsd->bhgld", probs, v.float()).to(q.dtype)


def _decode_blocks(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, max_len: int, block_size: int, sliding_window: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache blocks decode rows read (flat, row-major) and the [B, 1, 1, S] mask of the keys each sees."""
    device = block_tables.device
    n_blocks = -(-max_len // block_size)
    lens = seq_lens[:, None].long()
    if sliding_window and sliding_window < max_len - block_size:
        # Only the blocks that hold the window: each row starts at its own window's first block.
        n_blocks = -(-sliding_window // block_size) + 1
        first = ((lens - sliding_window).clamp(min=0) // block_size).clamp(max=block_tables.shape[1] - n_blocks)
        cols = first + torch.arange(n_blocks, device=device)[None, :]
        blocks = block_tables.gather(1, cols.to(torch.int64)).reshape(-1).long()
        pos = first * block_size + torch.arange(n_blocks * block_size, device=device)[None, :]
    else:
        blocks = block_tables[:, :n_blocks].reshape(-1).long()
        pos = torch.arange(n_blocks * block_size, device=device)[None, :]
    mask = pos < lens
    if sliding_window:
        mask &= pos >= lens - sliding_window  # the query sits at len - 1
    return blocks, mask[:, None, None, :]


def _decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_len: int,
    scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [B, H, D], one token per sequence -> [B, H, D]."""
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    groups = num_heads // num_kv_heads
    # The same for every layer of a step: computed once (step_memo.py).
    blocks, mask = step_memo(
        ("decode", max_len, block_size, sliding_window),
        (block_tables, seq_lens),
        lambda: _decode_blocks(block_tables, seq_lens, max_len, block_size, sliding_window),
    )
    # One index_select per cache; [B, Hkv, S, D] stays a strided view (SDPA reads it as is).
    k = _gather_kv(k_cache, blocks, q.dtype).view(num_seqs, -1, num_kv_heads, head_dim).transpose(1, 2)
    v = _gather_kv(v_cache, blocks, q.dtype).view(num_seqs, -1, num_kv_heads, head_dim).transpose(1, 2)
    # GQA without expanding K/V: the G query heads of a KV head become G query rows of that head.
    qg = q.view(num_seqs, num_kv_heads, groups, head_dim)
    if soft_cap or sinks is not None:
        sk = None if sinks is None else sinks.view(num_kv_heads, groups)
        out = _attend_math(qg[:, :, :, None], k, v, mask[:, :, :, None], scale, soft_cap, sk)
    else:
        out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)
    return out.reshape(num_seqs, num_heads, head_dim)


def _prefill_one(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    blocks_row: torch.Tensor,
    kv_len: int,
    scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [L, H, D], the last L of kv_len positions -> [L, H, D]."""
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    q_len, num_heads, head_dim = q.shape
    # Keys before the first query's window are never seen: skip their blocks.
    first = max(0, kv_len - q_len - sliding_window + 1) if sliding_window else 0
    first_block = first // block_size
    start = first_block * block_size
    n_blocks = -(-kv_len // block_size)
    blocks = blocks_row[first_block:n_blocks].long()
    # 4-D inputs: CPU SDPA takes its flash kernel (GQA included) for them, the slow math path for 3-D.
    k = _gather_kv(k_cache, blocks, q.dtype)[: kv_len - start].transpose(0, 1)[None]  # [1, Hkv, S, D]
    v = _gather_kv(v_cache, blocks, q.dtype)[: kv_len - start].transpose(0, 1)[None]
    qh = q.transpose(0, 1)[None]  # [1, H, L, D]
    plain = not (soft_cap or sinks is not None)
    if q_len == kv_len and not sliding_window and plain:
        out = F.scaled_dot_product_attention(qh, k, v, is_causal=True, scale=scale, enable_gqa=True)
        return out[0].transpose(0, 1)
    # Query i sits at absolute position kv_len - q_len + i and sees keys 0..that position
    # (with a window W, only the keys after position - W).
    qpos = torch.arange(kv_len - q_len, kv_len, device=q.device)
    kpos = torch.arange(start, kv_len, device=q.device)
    mask = kpos[None, :] <= qpos[:, None]
    if sliding_window:
        mask &= kpos[None, :] > qpos[:, None] - sliding_window
    if plain:
        out = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        return out[0].transpose(0, 1)
    groups = num_heads // num_kv_heads
    qg = qh.view(1, num_kv_heads, groups, q_len, head_dim)
    sk = None if sinks is None else sinks.view(num_kv_heads, groups)
    out = _attend_math(qg, k, v, mask, scale, soft_cap, sk)  # [1, Hkv, G, L, D]
    return out.reshape(num_heads, q_len, head_dim).transpose(0, 1)


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
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """See wslm.kernels.paged_attention."""
    num_seqs = seq_lens.shape[0]
    opts = dict(sliding_window=sliding_window, soft_cap=logits_soft_cap, sinks=sinks)
    if q.shape[0] == num_seqs and num_seqs:  # every sequence has exactly one query token: pure decode
        max_len = step_memo(("max_len",), (seq_lens,), lambda: int(seq_lens.max()))
        res = _decode(q, k_cache, v_cache, block_tables, seq_lens, max_len, scale, **opts)
        return res if out is None else out.copy_(res)
    if out is None:
        out = torch.empty_like(q)
    if q.shape[0] == 0 or num_seqs == 0:
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
            max(lens[i] for i in decode_ids), scale, **opts,
        )
        out.index_copy_(0, rows, res.to(out.dtype))
        done = set(decode_ids)
    else:
        done = set()
    for i in range(num_seqs):
        if i in done or q_lens[i] == 0:
            continue
        s, e = cu[i], cu[i + 1]
        out[s:e] = _prefill_one(q[s:e], k_cache, v_cache, block_tables[i], lens[i], scale, **opts)
    return out
