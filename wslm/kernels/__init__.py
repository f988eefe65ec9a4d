"""Kernels of the engine over the paged KV cache: Triton on CUDA, PyTorch references everywhere else.

Public functions (vLLM's names and layouts):
  paged_attention    attention of new query tokens over their sequences' cached keys/values (decode,
                     prefill, prefill on a cached prefix, mixed in one batch; GQA)
  reshape_and_cache  write new keys/values into their cache slots
  rms_norm           RMSNorm, optionally fused with the residual add
  rotary_embedding   rotary position embedding (neox or GPT-J style), in place
  fused_moe          mixture-of-experts MLP over routed tokens (experts grouped; Triton grouped GEMM on CUDA)
  gguf_matmul        activations times a GGUF weight kept in its file's block bytes (Q4_0, Q4_1, Q5_0,
                     Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; Triton GEMV/GEMM on CUDA, dequantize + matmul reference elsewhere)
  gguf_dequantize    such a weight (or a gather of its rows) to float32, bit-equal to gguf-py

Each takes `backend="triton" | "torch" | None`. None picks Triton for CUDA tensors and PyTorch otherwise;
env WSLM_KERNEL_BACKEND=triton|torch overrides None. `selected_backend(device)` says what None picks and
`backend_description(device)` gives one line for the start-up log. The PyTorch versions are the engine's
CPU path and the references the Triton kernels are tested against (tests/test_kernels_*.py, run on CPU
under TRITON_INTERPRET=1). Triton is imported only when the triton backend runs.

Cache layout: k_cache / v_cache are [num_blocks, block_size, num_kv_heads, head_dim]; token slot
`s` lives at block s // block_size, offset s % block_size."""

from __future__ import annotations

from collections.abc import Callable

import torch

from wslm.kernels.dispatch import backend_description, resolve, selected_backend

__all__ = [
    "fused_moe",
    "gguf_dequantize",
    "gguf_matmul",
    "paged_attention",
    "reshape_and_cache",
    "rms_norm",
    "rotary_embedding",
    "selected_backend",
    "backend_description",
]


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    backend: str | None = None,
    *,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new query tokens over its paged keys/values.

    q [num_tokens, num_heads, head_dim], sequences packed back to back as cu_seqlens_q (int32
    [num_seqs + 1]) says; k_cache/v_cache [num_blocks, block_size, num_kv_heads, head_dim] already hold
    the new tokens' keys/values (see reshape_and_cache); block_tables int32 [num_seqs, max_blocks];
    seq_lens int32 [num_seqs], the KV length including the new tokens. Query i of a sequence with L
    query tokens and S keys sits at position S - L + i and sees keys 0..S - L + i. num_heads must be a
    multiple of num_kv_heads (GQA). Returns [num_tokens, num_heads, head_dim], written into `out` when
    given. Optional max_seqlen_q / max_seqlen_k (host ints) spare the Triton path a device sync; when
    every sequence has one query token (num_tokens == num_seqs) the split-KV decode kernel runs.

    Per-layer options (vLLM's names; None/0 = off):
      sliding_window   W: a query at position p sees only keys k with p - W < k <= p (HF's Mistral/Gemma
                       convention: W keys including itself); blocks wholly before the window are skipped.
      logits_soft_cap  c: scores (after `scale`) become c * tanh(scores / c) before the softmax (Gemma 2).
      sinks            float [num_heads]: a learned logit per head added to the softmax's denominator only,
                       attending to nothing (gpt-oss); not multiplied by `scale`."""
    opts = dict(sliding_window=sliding_window, logits_soft_cap=logits_soft_cap, sinks=sinks)
    be = resolve(backend, q.device)
    if be == "triton":
        from wslm.kernels.triton_paged_attention import paged_attention as impl

        return impl(
            q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, out,
            max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, **opts,
        )
    from wslm.kernels.torch_paged_attention import paged_attention as ref

    return ref(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, out, **opts)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    backend: str | None = None,
) -> None:
    """Writes key/value [num_tokens, num_kv_heads, head_dim] into the caches in place, token t at slot
    slot_mapping[t] (= block * block_size + offset); slot -1 skips the token (padding)."""
    be = resolve(backend, key.device)
    if be == "triton":
        from wslm.kernels.triton_cache import reshape_and_cache as impl
    else:
        from wslm.kernels.torch_cache import reshape_and_cache as impl
    impl(key, value, k_cache, v_cache, slot_mapping)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dimension, as HF LlamaRMSNorm: statistics in fp32, cast back to x's dtype
    before the weight. Returns normed(x); with `residual`, returns (normed(x + residual), x + residual),
    the sum taken in x's dtype (vLLM's fused_add_rms_norm, out of place). Output dtype is x's dtype."""
    be = resolve(backend, x.device)
    if be == "triton":
        from wslm.kernels.triton_norm import rms_norm as impl
    else:
        from wslm.kernels.torch_norm import rms_norm as impl
    return impl(x, weight, eps, residual)


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    head_dim: int | None = None,
    is_neox_style: bool = True,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotates q and k IN PLACE and returns them.

    positions [num_tokens]; q [num_tokens, num_heads * head_dim] or [num_tokens, num_heads, head_dim],
    k likewise with the KV heads (or None); cos_sin_cache [max_position, rot_dim], cos in the first half,
    sin in the second (vLLM's layout). Only the first rot_dim dims of each head rotate (partial rotary).
    head_dim defaults to q's last dim for 3-D q, else to rot_dim. is_neox_style=True is HF Llama's
    rotate_half (pairs i, i + rot_dim/2); False is GPT-J's interleaved pairs (2i, 2i + 1)."""
    be = resolve(backend, q.device)
    if be == "triton":
        from wslm.kernels.triton_rotary import rotary_embedding as impl
    else:
        from wslm.kernels.torch_rotary import rotary_embedding as impl
    return impl(positions, q, k, cos_sin_cache, head_dim, is_neox_style)


def fused_moe(
    hidden: torch.Tensor,
    w13: torch.Tensor | list,
    w2: torch.Tensor | list,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    act_and_mul: Callable[[torch.Tensor], torch.Tensor],
    backend: str | None = None,
) -> torch.Tensor:
    """sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(hidden[t]) for each token t.

    hidden [T, H]; w13 [E, 2 * I, H], each expert's gate and up projections stacked (HF's gate_up_proj);
    w2 [E, H, I]; topk_weights [T, k] (model dtype, already normalised as the model wants) and topk_ids
    [T, k] from the router; act_and_mul maps [.., 2 * I] -> [.., I] (e.g. silu(gate) * up). Returns [T, H]
    in hidden's dtype. Each expert's output is rounded to that dtype before its weight multiplies it (HF).

    Quantized experts come as lists of per-expert weights with an `apply` (see torch_moe): they take the
    PyTorch grouped path on every device (no fused quantized Triton kernel yet). On CUDA that is torch's
    int4 tinygemm per active expert, and for int8 a per-call dequantize of each active expert."""
    be = resolve(backend, hidden.device)
    if be == "triton" and isinstance(w13, torch.Tensor):
        from wslm.kernels.triton_moe import fused_moe as impl
    else:
        from wslm.kernels.torch_moe import fused_moe as impl
    return impl(hidden, w13, w2, topk_weights, topk_ids, act_and_mul)


def gguf_matmul(
    x: torch.Tensor,
    raw: torch.Tensor,
    ggml_type: int | str,
    backend: str | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [..., cols] @ W.T -> [..., rows] in x's dtype, W the GGUF weight whose blocks `raw` holds as the
    file stores them: uint8 [rows, bytes_per_row] (rows contiguous), `ggml_type` its type by name ("Q4_K")
    or number (gguf.GGMLQuantizationType). Sums in float32. With `out` ([rows of x flattened, rows], x's
    dtype, last axis contiguous, e.g. out_all[:, n0:n1] for one part of a fused q|k|v whose parts have
    different types) the result is written there and `out` returned.

    Triton (CUDA): up to 32 rows the decode GEMV dequantizes in registers with float32 weights (within
    float32 rounding of torch_gguf.matmul); more rows take the prefill GEMM, whose tensor-core dot rounds
    the dequantized weights to x's dtype (torch_gguf.matmul(..., round_weight=True)). The torch backend
    dequantizes the whole weight to float32 per call: the reference, not a fast CPU path."""
    be = resolve(backend, x.device)
    if be == "triton":
        from wslm.kernels.triton_gguf import gguf_matmul as impl

        return impl(x, raw, ggml_type, out)
    from wslm.kernels.torch_gguf import matmul as ref

    return ref(x, raw, ggml_type, out=out)


def gguf_dequantize(raw: torch.Tensor, ggml_type: int | str, backend: str | None = None) -> torch.Tensor:
    """GGUF block bytes uint8 [rows, bytes_per_row] -> float32 [rows, cols], bit-equal to gguf-py's
    gguf.quants.dequantize on every backend (e.g. the embedding rows of a batch: raw[token_ids])."""
    be = resolve(backend, raw.device)
    if be == "triton":
        from wslm.kernels.triton_gguf import gguf_dequantize as impl
    else:
        from wslm.kernels.torch_gguf import dequantize as impl
    return impl(raw, ggml_type)
