"""The PyTorch kernels (the engine's CPU path) against naive dense oracles and HF's Llama modules."""

from __future__ import annotations

import pytest
import torch
from kernel_testing import make_paged_batch, naive_attention

from wslm.kernels import paged_attention, reshape_and_cache, rms_norm, rotary_embedding

CASES = {
    "decode": ([1, 1, 1], [5, 33, 17]),
    "prefill": ([7, 16, 3], [7, 16, 3]),
    "cached_prefix": ([5, 9], [21, 40]),
    "mixed": ([1, 6, 1, 12, 1], [30, 6, 1, 29, 64]),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize("block_size", [16, 32])
def test_paged_attention_matches_dense(case, heads, block_size):
    q_lens, kv_lens = CASES[case]
    batch = make_paged_batch(q_lens, kv_lens, heads[0], heads[1], 64, block_size)
    out = paged_attention(
        batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.cu_seqlens_q, batch.seq_lens,
        0.125, backend="torch",
    )
    torch.testing.assert_close(out, naive_attention(batch, 0.125), atol=2e-5, rtol=2e-5)


def test_paged_attention_writes_out_and_head_dim_128():
    batch = make_paged_batch([1, 4], [9, 50], 4, 2, 128, 16)
    out = torch.full_like(batch.q, float("nan"))
    res = paged_attention(
        batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.cu_seqlens_q, batch.seq_lens,
        0.1, out=out, backend="torch",
    )
    assert res is out
    torch.testing.assert_close(out, naive_attention(batch, 0.1), atol=2e-5, rtol=2e-5)


def test_reshape_and_cache_skips_minus_one():
    k_cache = torch.zeros(4, 16, 2, 8)
    v_cache = torch.zeros(4, 16, 2, 8)
    key, value = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    reshape_and_cache(key, value, k_cache, v_cache, torch.tensor([17, -1, 63]), backend="torch")
    torch.testing.assert_close(k_cache[1, 1], key[0])
    torch.testing.assert_close(v_cache[3, 15], value[2])
    assert int((k_cache != 0).any(-1).any(-1).sum()) == 2


def test_rms_norm_matches_hf():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    hf = LlamaRMSNorm(64, eps=1e-6).to(torch.bfloat16)
    with torch.no_grad():
        hf.weight.copy_(torch.randn(64))
    x, r = torch.randn(5, 64, dtype=torch.bfloat16), torch.randn(5, 64, dtype=torch.bfloat16)
    w = hf.weight.detach()
    torch.testing.assert_close(rms_norm(x, w, 1e-6, backend="torch"), hf(x), atol=0, rtol=0)
    normed, summed = rms_norm(x, w, 1e-6, residual=r, backend="torch")
    torch.testing.assert_close(summed, x + r, atol=0, rtol=0)
    torch.testing.assert_close(normed, hf(x + r), atol=0, rtol=0)


def test_rotary_matches_hf_rotate_half():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    head_dim, max_pos = 16, 64
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq)
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    pos = torch.tensor([0, 3, 7, 63, 5])
    q, k = torch.randn(5, 4, head_dim), torch.randn(5, 2, head_dim)
    emb = torch.cat((freqs, freqs), dim=-1)[pos]
    q_ref, k_ref = apply_rotary_pos_emb(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], emb.cos()[None], emb.sin()[None]
    )
    q2, k2 = q.reshape(5, -1).clone(), k.reshape(5, -1).clone()
    rq, rk = rotary_embedding(pos, q2, k2, cache, head_dim, backend="torch")
    assert rq is q2 and rk is k2  # in place
    torch.testing.assert_close(q2.view(5, 4, head_dim), q_ref[0].transpose(0, 1), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(k2.view(5, 2, head_dim), k_ref[0].transpose(0, 1), atol=1e-6, rtol=1e-5)


OPTIONS = {
    "window": dict(sliding_window=8),
    "softcap": dict(logits_soft_cap=2.0),
    "sinks": dict(sinks=torch.tensor([0.5, -1.0, 2.0, 0.0, 1.5, -0.5, 3.0, 0.25])),
    "all": dict(sliding_window=5, logits_soft_cap=3.0, sinks=torch.linspace(-1, 2, 8)),
}


@pytest.mark.parametrize("case", ["decode", "mixed", "cached_prefix"])
@pytest.mark.parametrize("option", list(OPTIONS))
def test_paged_attention_options_match_dense(case, option):
    q_lens, kv_lens = CASES[case]
    batch = make_paged_batch(q_lens, kv_lens, 8, 2, 64, 16)
    opts = OPTIONS[option]
    out = paged_attention(
        batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.cu_seqlens_q, batch.seq_lens,
        0.125, backend="torch", **opts,
    )
    torch.testing.assert_close(out, naive_attention(batch, 0.125, **opts), atol=2e-5, rtol=2e-5)


def test_sliding_window_matches_hf_mask():
    # The window's convention comes from transformers itself: its mask function, applied densely.
    from transformers.masking_utils import sliding_window_causal_mask_function

    window, n = 5, 13
    fn = sliding_window_causal_mask_function(window)
    t = torch.tensor
    mask = torch.stack([torch.stack([fn(t(0), t(0), t(qi), t(ki)) for ki in range(n)]) for qi in range(n)])
    batch = make_paged_batch([n], [n], 2, 1, 16, 4)
    q, k, v = batch.q.float(), batch.keys[0].float(), batch.values[0].float()
    scores = torch.einsum("lhd,sd->hls", q, k[:, 0]).masked_fill(~mask, float("-inf"))
    ref = torch.einsum("hls,sd->lhd", scores.softmax(-1), v[:, 0])
    for q_len in (n, 1):  # prefill, and decode of the last position
        out = paged_attention(
            batch.q[-q_len:], batch.k_cache, batch.v_cache, batch.block_tables,
            torch.tensor([0, q_len], dtype=torch.int32), batch.seq_lens, 1.0, backend="torch",
            sliding_window=window,
        )
        torch.testing.assert_close(out, ref[-q_len:], atol=2e-5, rtol=2e-5)


def test_windowed_decode_reads_only_the_window():
    # Long and short rows: each row gathers its own window's blocks (a padded table, as the engine's).
    batch = make_paged_batch([1] * 5, [300, 1, 64, 129, 77], 4, 2, 32, 16)
    wide = torch.zeros(5, 24, dtype=torch.int32)
    wide[:, : batch.block_tables.shape[1]] = batch.block_tables
    batch.block_tables = wide
    for window in (40, 64, 200):
        out = paged_attention(
            batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.cu_seqlens_q, batch.seq_lens,
            0.2, backend="torch", sliding_window=window, sinks=torch.ones(4),
        )
        want = naive_attention(batch, 0.2, sliding_window=window, sinks=torch.ones(4))
        torch.testing.assert_close(out, want, atol=2e-5, rtol=2e-5)
