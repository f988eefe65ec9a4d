"""Helpers for kernel tests and benchmarks: random paged caches, a naive dense attention oracle, GGUF block
bytes."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedBatch:
    q: torch.Tensor  # [num_tokens, H, D]
    k_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks]
    cu_seqlens_q: torch.Tensor  # int32 [num_seqs + 1]
    seq_lens: torch.Tensor  # int32 [num_seqs]
    keys: list[torch.Tensor]  # per sequence, dense [S, Hkv, D] (what the cache holds)
    values: list[torch.Tensor]


def make_paged_batch(
    q_lens: list[int],
    kv_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    extra_blocks: int = 3,
    seed: int = 0,
) -> PagedBatch:
    """A batch whose sequences' blocks are scattered over the pool in random order (padded tables)."""
    assert all(0 < q <= s for q, s in zip(q_lens, kv_lens, strict=True))
    g = torch.Generator().manual_seed(seed)
    per_seq = [-(-s // block_size) for s in kv_lens]
    num_blocks = sum(per_seq) + extra_blocks
    max_blocks = max(per_seq) + 1  # one padding column, as an engine's table would have
    perm = torch.randperm(num_blocks, generator=g)
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(dtype)
    tables = torch.zeros(len(kv_lens), max_blocks, dtype=torch.int32)
    keys, values, used = [], [], 0
    for i, (n, s) in enumerate(zip(per_seq, kv_lens, strict=True)):
        blocks = perm[used : used + n]
        used += n
        tables[i, :n] = blocks.int()
        keys.append(k_cache[blocks].flatten(0, 1)[:s].to(device))
        values.append(v_cache[blocks].flatten(0, 1)[:s].to(device))
    cu = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(q_lens).cumsum(0)
    q = torch.randn(int(cu[-1]), num_heads, head_dim, generator=g).to(dtype)
    return PagedBatch(
        q.to(device), k_cache.to(device), v_cache.to(device), tables.to(device), cu.to(device),
        torch.tensor(kv_lens, dtype=torch.int32, device=device), keys, values,
    )


def naive_attention(
    batch: PagedBatch,
    scale: float,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dense fp32 attention per sequence and head with an explicit causal mask: the oracle.

    sliding_window W: a query at position p sees keys k with p - W < k <= p (HF's convention);
    logits_soft_cap c: scores become c * tanh(scores / c) before the mask; sinks [H]: one extra logit
    per head in the softmax's denominator (gpt-oss)."""
    cu = batch.cu_seqlens_q.tolist()
    out = torch.empty(batch.q.shape, dtype=torch.float32, device=batch.q.device)
    num_heads = batch.q.shape[1]
    for i, (k, v) in enumerate(zip(batch.keys, batch.values, strict=True)):
        q = batch.q[cu[i] : cu[i + 1]].float()
        q_len, kv_len, group = q.shape[0], k.shape[0], num_heads // k.shape[1]
        k = k.float().repeat_interleave(group, dim=1)  # [S, H, D]
        v = v.float().repeat_interleave(group, dim=1)
        scores = torch.einsum("lhd,shd->hls", q, k) * scale
        if logits_soft_cap:
            scores = logits_soft_cap * torch.tanh(scores / logits_soft_cap)
        qpos = torch.arange(kv_len - q_len, kv_len)[:, None]
        kpos = torch.arange(kv_len)[None, :]
        visible = kpos <= qpos
        if sliding_window:
            visible &= kpos > qpos - sliding_window
        scores = scores.masked_fill(~visible.to(scores.device), float("-inf"))
        if sinks is not None:
            sink = sinks.float().to(scores.device)[:, None, None].expand(-1, q_len, 1)
            probs = torch.cat((scores, sink), -1).softmax(-1)[..., :-1]
        else:
            probs = scores.softmax(-1)
        out[cu[i] : cu[i + 1]] = torch.einsum("hls,shd->lhd", probs, v)
    return out


# Byte offsets of each GGUF block format's f16 fields (d; Q4_1's m; the K-quants' dmin).
GGUF_HALF_FIELDS = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2),
    "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,),
}


def random_gguf_blocks(rows: int, cols: int, name: str, seed: int = 0, specials: bool = False) -> torch.Tensor:
    """uint8 [rows, bytes_per_row] of GGUF `name` blocks: every quant and scale byte random (all bit
    patterns), the f16 fields finite and of a real file's magnitude (d ~ 0.01; Q4_0/Q5_0's d of either sign;
    Q4_1/Q5_1's m negative). specials=True puts 0, -0, the smallest subnormal and the largest half into some
    f16 fields (exactness checks, not matmuls)."""
    from wslm.kernels.torch_gguf import FORMATS

    if name in FORMATS:
        block_weights, block_bytes = FORMATS[name].block_weights, FORMATS[name].block_bytes
    else:  # types only gguf-py reads (Q2_K, Q3_K)
        import gguf

        block_weights, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]
    g = torch.Generator().manual_seed(seed)
    nb = cols // block_weights
    raw = torch.randint(0, 256, (rows, nb, block_bytes), dtype=torch.uint8, generator=g)
    for i, at in enumerate(GGUF_HALF_FIELDS[name]):
        v = torch.rand(rows, nb, generator=g) * 0.02 + 1e-4
        if name in ("Q4_0", "Q5_0"):  # d = max / -8 (-16): either sign
            v = v * torch.where(torch.rand(rows, nb, generator=g) < 0.5, -1.0, 1.0)
        elif name in ("Q4_1", "Q5_1") and i == 1:  # m: the block's minimum
            v = -8 * v
        if specials:
            flat = v.view(-1)
            for j, s in enumerate((0.0, -0.0, 2.0**-24, 65504.0)):
                flat[j * 3 % flat.numel()] = s
        raw[..., at:at + 2] = v.to(torch.float16).view(torch.uint8).view(rows, nb, 2)
    return raw.view(rows, nb * block_bytes)


# The block types gguf-py's own quantizer writes (gguf.quants.quantize); the K-quants it only reads.
GGUF_QUANTIZABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")


def gguf_tensor_blocks(name: str, rows: int, cols: int, seed: int = 0, outliers: bool = False):
    """Raw bytes (numpy uint8 [rows, bytes_per_row]) of a [rows, cols] GGUF tensor of type `name`: gguf-py's
    quantizer of weight-like values (rows of different magnitude; outliers: a few values 20x) where it has
    one, else random_gguf_blocks (every byte pattern is a valid K-quant block)."""
    import gguf
    import numpy as np

    if name in GGUF_QUANTIZABLE:
        rng = np.random.default_rng(seed)
        w = rng.standard_normal((rows, cols)) * rng.uniform(0.01, 0.1, (rows, 1))
        if outliers:
            w[rng.random(w.shape) < 0.002] *= 20
        return gguf.quants.quantize(w.astype(np.float32), gguf.GGMLQuantizationType[name])
    return random_gguf_blocks(rows, cols, name, seed).numpy()
