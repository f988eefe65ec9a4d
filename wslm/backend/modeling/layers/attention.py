"""One layer's attention over the paged KV cache, with its per-layer options.

The step's sequences are packed back to back (AttentionMetadata says where each starts and how long its
KV is); each layer writes its new keys/values into its cache slots and attends through wslm.kernels, so
decode, prefill and prefill on a cached prefix share one path. Per-layer options use vLLM's names:
sliding_window (tokens a query sees, itself included), logits_soft_cap (cap * tanh(score / cap), Gemma 2)
and sinks (a learned per-head logit in the softmax denominator, GPT-OSS)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from wslm import kernels


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64: where each new token's K/V goes
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    cu_seqlens_q: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32, KV length including the new tokens
    logits_indices: torch.Tensor  # [num_sampled] int64: last token of each sequence that samples
    max_seqlen_q: int = 0  # host-side maxima spare the kernels a device sync
    max_seqlen_k: int = 0
    # The step scores prompt tokens (prompt_logprobs rows in logits_indices): the LM head gives float32
    # logits from its unrounded sums for them, as a user reading probabilities expects.
    prompt_logprobs: bool = False
    # Image tokens that attend bidirectionally within their image (Gemma 3): (first row, end row, sequence
    # index, position of the first row) per image ending in this step (layers/image_attention.py).
    image_spans: list | None = None


class Attention:
    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        *,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
        backend: str | None = None,
    ) -> None:
        self.num_heads = num_heads  # this rank's
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap
        # [num_heads] fp32 per-head sink logits, loaded with the weights when the model has them.
        self.sinks: torch.Tensor | None = None
        self.backend = backend

    def _options(self) -> dict:
        # Only the options a layer uses go to the kernel: plain layers call it exactly as before.
        opts = {}
        if self.sliding_window is not None:
            opts["sliding_window"] = self.sliding_window
        if self.logits_soft_cap is not None:
            opts["logits_soft_cap"] = self.logits_soft_cap
        if self.sinks is not None:
            opts["sinks"] = self.sinks
        return opts

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """q/k/v [num_tokens, heads * head_dim] (strided slices of a fused qkv are fine: the kernels take
        them as they are). Returns [num_tokens, num_heads * head_dim]."""
        n = q.shape[0]
        if self.backend is None:  # chosen once (by device and WSLM_KERNEL_BACKEND), not on every call
            self.backend = kernels.selected_backend(q.device)
        be = self.backend
        k_cache, v_cache = kv_cache
        q = q.view(n, self.num_heads, self.head_dim)
        k = k.view(n, self.num_kv_heads, self.head_dim)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        kernels.reshape_and_cache(k, v, k_cache, v_cache, meta.slot_mapping, backend=be)
        out = kernels.paged_attention(
            q, k_cache, v_cache, meta.block_tables, meta.cu_seqlens_q, meta.seq_lens, self.scale,
            backend=be, max_seqlen_q=meta.max_seqlen_q, max_seqlen_k=meta.max_seqlen_k, **self._options(),
        )  # fmt: skip
        if meta.image_spans:
            from wslm.backend.modeling.layers.image_attention import attend_image_rows

            attend_image_rows(out, q, k_cache, v_cache, meta.image_spans, meta.block_tables, self.scale,
                              self.sliding_window, self.logits_soft_cap)
        return out.reshape(n, self.num_heads * self.head_dim)
