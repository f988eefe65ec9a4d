"""The Triton kernels against the PyTorch references and a naive dense oracle.

Without CUDA they run on CPU tensors under Triton's interpreter (TRITON_INTERPRET=1, fp32, tiny shapes);
on a CUDA machine the same tests run the compiled kernels on the GPU."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    # Must precede the first import of the kernel modules: @triton.jit reads it at decoration time.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from kernel_testing import make_paged_batch, naive_attention  # noqa: E402

from wslm.kernels import paged_attention, reshape_and_cache, rms_norm, rotary_embedding  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# (query lengths, KV lengths) per sequence; KV lengths mostly not block multiples.
CASES = {
    "decode": ([1, 1, 1], [5, 33, 17]),
    "prefill": ([7, 16, 19], [7, 16, 19]),
    "cached_prefix": ([5, 9], [21, 40]),
    "mixed": ([1, 6, 1, 12, 3], [30, 6, 1, 29, 67]),
}


def _attend(batch, backend, scale, **kw):
    return paged_attention(
        batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.cu_seqlens_q, batch.seq_lens,
        scale, backend=backend, **kw,
    )


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_size", [16, 32])
def test_paged_attention(case, heads, head_dim, block_size):
    q_lens, kv_lens = CASES[case]
    batch = make_paged_batch(q_lens, kv_lens, heads[0], heads[1], head_dim, block_size, device=DEVICE)
    scale = head_dim**-0.5
    tri = _attend(batch, "triton", scale)
    ref = _attend(batch, "torch", scale)
    dense = naive_attention(batch, scale)
    torch.testing.assert_close(tri, dense, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tri, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("partition_size", [64, 128])
@pytest.mark.parametrize("block_size", [16, 32])
def test_split_kv_decode(partition_size, block_size):
    # Long and short sequences: some use several partitions, some only the first (the reduce skips the rest).
    kv_lens = [300, 1, 64, 129, 77]
    batch = make_paged_batch([1] * len(kv_lens), kv_lens, 8, 2, 64, block_size, device=DEVICE)
    from wslm.kernels.triton_paged_attention import paged_attention as triton_paged_attention

    tri = triton_paged_attention(
        batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.cu_seqlens_q, batch.seq_lens,
        0.125, partition_size=partition_size,
    )
    torch.testing.assert_close(tri, naive_attention(batch, 0.125), atol=1e-5, rtol=1e-5)


def test_decode_heuristic_split_and_max_seqlen_hints():
    # Few sequences x KV heads: the heuristic splits the KV axis (a padded block table, as an engine has).
    batch = make_paged_batch([1, 1], [700, 260], 4, 1, 64, 16, device=DEVICE)
    wide = torch.zeros(2, 64, dtype=torch.int32, device=DEVICE)
    wide[:, : batch.block_tables.shape[1]] = batch.block_tables
    batch.block_tables = wide
    dense = naive_attention(batch, 0.125)
    torch.testing.assert_close(_attend(batch, "triton", 0.125), dense, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(_attend(batch, "triton", 0.125, max_seqlen_k=700), dense, atol=1e-5, rtol=1e-5)


def test_prefill_max_seqlen_hint_and_out_buffer():
    batch = make_paged_batch([40, 1, 3], [40, 9, 50], 4, 2, 64, 16, device=DEVICE)
    out = torch.full_like(batch.q, float("nan"))
    res = _attend(batch, "triton", 0.125, out=out, max_seqlen_q=40, max_seqlen_k=50)
    assert res is out
    torch.testing.assert_close(out, naive_attention(batch, 0.125), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("q_lens", [[1, 5], [1, 1]], ids=["mixed", "decode"])
def test_non_power_of_two_head_dim_group_and_strided_q(q_lens):
    # head_dim 80 and 3 query heads per KV head exercise the padded lanes
    batch = make_paged_batch(q_lens, [20, 11], 6, 2, 80, 16, device=DEVICE)
    # q as a slice of a fused qkv projection: rows strided, heads contiguous.
    qkv = torch.randn(batch.q.shape[0], 3 * 6 * 80, device=DEVICE)
    qkv[:, : 6 * 80] = batch.q.reshape(batch.q.shape[0], -1)
    batch.q = qkv[:, : 6 * 80].view(-1, 6, 80)
    torch.testing.assert_close(_attend(batch, "triton", 0.1), naive_attention(batch, 0.1), atol=1e-5, rtol=1e-5)


def test_half_precision():
    batch = make_paged_batch([1, 1], [40, 70], 4, 2, 64, 16, dtype=torch.float16, device=DEVICE)
    torch.testing.assert_close(_attend(batch, "triton", 0.125).float(), naive_attention(batch, 0.125),
                               atol=2e-3, rtol=2e-3)
    batch = make_paged_batch([9, 4], [9, 30], 4, 2, 64, 16, dtype=torch.float16, device=DEVICE)
    torch.testing.assert_close(_attend(batch, "triton", 0.125).float(), naive_attention(batch, 0.125),
                               atol=2e-3, rtol=2e-3)


OPTIONS = {
    "window": dict(sliding_window=9),
    "softcap": dict(logits_soft_cap=2.5),
    "sinks": dict(sinks=torch.tensor([0.5, -1.0, 2.0, 0.0, 1.5, -0.5], device=DEVICE)),
    "all": dict(sliding_window=70, logits_soft_cap=1.5, sinks=torch.linspace(-1, 2, 6, device=DEVICE)),
}


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("q_lens", [[1, 1, 1], [1, 7, 3, 1]], ids=["decode", "mixed"])
def test_paged_attention_options(option, q_lens):
    # 3 query heads per KV head (padded group lanes), windows inside and across blocks and tiles.
    kv_lens = [90, 7, 33, 150][: len(q_lens)]
    batch = make_paged_batch(q_lens, kv_lens, 6, 2, 32, 16, device=DEVICE)
    opts = OPTIONS[option]
    dense = naive_attention(batch, 0.2, **opts)
    torch.testing.assert_close(_attend(batch, "triton", 0.2, **opts), dense, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(_attend(batch, "torch", 0.2, **opts), dense, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 100, 64])
def test_split_kv_decode_options(window):
    # Partitions tile the window; the sink joins partition 0's sum only; a window shorter than a sequence
    # skips its early blocks, one longer than it changes nothing.
    kv_lens = [300, 1, 64, 129, 77]
    sinks = torch.tensor([1.0, -2.0, 0.5, 3.0], device=DEVICE)
    batch = make_paged_batch([1] * len(kv_lens), kv_lens, 4, 2, 32, 16, device=DEVICE)
    from wslm.kernels.triton_paged_attention import paged_attention as triton_paged_attention

    opts = dict(sliding_window=window, logits_soft_cap=4.0, sinks=sinks)
    tri = triton_paged_attention(
        batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.cu_seqlens_q, batch.seq_lens,
        0.125, partition_size=64, **opts,
    )
    torch.testing.assert_close(tri, naive_attention(batch, 0.125, **opts), atol=1e-5, rtol=1e-5)


def test_long_prefill_with_window():
    # A prefill of 150 tokens with a window of 20: query tiles start past many skipped key tiles.
    batch = make_paged_batch([150, 40], [150, 100], 4, 4, 32, 16, device=DEVICE)
    dense = naive_attention(batch, 0.2, sliding_window=20)
    torch.testing.assert_close(_attend(batch, "triton", 0.2, sliding_window=20), dense, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_kv_heads, head_dim, block_size", [(2, 64, 16), (3, 128, 32)])
def test_reshape_and_cache(num_kv_heads, head_dim, block_size):
    caches = {}
    num_tokens = 7
    slots = torch.tensor([0, 17, -1, 5, 40, -1, 63], device=DEVICE)
    # key/value as slices of a fused kv projection (token stride > Hkv * D)
    kv = torch.randn(num_tokens, 2, num_kv_heads, head_dim, device=DEVICE)
    key, value = kv[:, 0], kv[:, 1]
    for backend in ("triton", "torch"):
        k_cache = torch.zeros(64 // block_size + 1, block_size, num_kv_heads, head_dim, device=DEVICE)
        v_cache = torch.zeros_like(k_cache)
        reshape_and_cache(key, value, k_cache, v_cache, slots, backend=backend)
        caches[backend] = (k_cache, v_cache)
    k_tri, v_tri = caches["triton"]
    torch.testing.assert_close(k_tri, caches["torch"][0], atol=0, rtol=0)
    torch.testing.assert_close(v_tri, caches["torch"][1], atol=0, rtol=0)
    flat_k = k_tri.flatten(0, 1)
    torch.testing.assert_close(flat_k[17], key[1])
    assert int(flat_k.abs().sum(dim=(1, 2)).ne(0).sum()) == 5  # the two -1 tokens wrote nothing


@pytest.mark.parametrize("hidden", [64, 96])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rms_norm(hidden, dtype):
    x = torch.randn(2, 3, hidden, device=DEVICE).to(dtype)
    r = torch.randn(2, 3, hidden, device=DEVICE).to(dtype)
    w = (1 + 0.1 * torch.randn(hidden, device=DEVICE)).to(dtype)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(rms_norm(x, w, 1e-6, backend="triton"), rms_norm(x, w, 1e-6, backend="torch"),
                               **tol)
    n_tri, s_tri = rms_norm(x, w, 1e-6, residual=r, backend="triton")
    n_ref, s_ref = rms_norm(x, w, 1e-6, residual=r, backend="torch")
    torch.testing.assert_close(s_tri, s_ref, atol=0, rtol=0)
    torch.testing.assert_close(n_tri, n_ref, **tol)
    assert n_tri.dtype == dtype and n_tri.shape == x.shape


def _cos_sin_cache(rot_dim: int, max_pos: int = 64) -> torch.Tensor:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rot_dim, 2).float() / rot_dim))
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(DEVICE)


@pytest.mark.parametrize("neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("layout", ["flat", "heads"])
@pytest.mark.parametrize("rot_dim", [32, 16], ids=["full", "partial"])
def test_rotary(neox, layout, rot_dim):
    head_dim, num_heads, num_kv_heads, num_tokens = 32, 4, 2, 5
    cache = _cos_sin_cache(rot_dim)
    pos = torch.tensor([0, 3, 7, 63, 5], device=DEVICE)
    # q and k as slices of one qkv tensor, as the engine's fused projection gives them
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, device=DEVICE)
    results = {}
    for backend in ("triton", "torch"):
        buf = qkv.clone()
        q, k = buf[:, : num_heads * head_dim], buf[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim]
        if layout == "heads":
            q, k = q.view(num_tokens, num_heads, head_dim), k.view(num_tokens, num_kv_heads, head_dim)
        rq, rk = rotary_embedding(pos, q, k, cache, head_dim, is_neox_style=neox, backend=backend)
        assert rq is q and rk is k
        results[backend] = buf
    torch.testing.assert_close(results["triton"], results["torch"], atol=1e-6, rtol=1e-5)
    tail = (num_heads + num_kv_heads) * head_dim
    torch.testing.assert_close(results["triton"][:, tail:], qkv[:, tail:], atol=0, rtol=0)  # v untouched
    if rot_dim < head_dim:  # the unrotated part of each head is untouched
        heads = results["triton"][:, :tail].view(num_tokens, -1, head_dim)
        torch.testing.assert_close(heads[..., rot_dim:], qkv[:, :tail].view(num_tokens, -1, head_dim)[..., rot_dim:])
    assert not torch.equal(results["triton"], qkv)


def test_rotary_without_k():
    cache = _cos_sin_cache(16)
    q = torch.randn(3, 2, 16, device=DEVICE)
    q_ref = q.clone()
    pos = torch.tensor([1, 2, 9], device=DEVICE)
    rotary_embedding(pos, q, None, cache, backend="triton")
    rotary_embedding(pos, q_ref, None, cache, backend="torch")
    torch.testing.assert_close(q, q_ref, atol=1e-6, rtol=1e-5)
