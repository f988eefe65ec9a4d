"""Llama-family decoder (Llama 2/3, SmolLM, Mistral, Qwen2) over a flattened, variable-length batch.

All sequences of a step are concatenated into one [num_tokens, hidden] tensor; attention reads and writes
the paged KV cache through wslm.kernels, so decode, prefill and cached-prefix prefill share one path."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from wslm import kernels
from wslm.backend.distributed.parallel_state import get_tp_size
from wslm.backend.distributed.sharding import (
    local_num_heads,
    local_num_kv_heads,
    parallel_lm_head,
    row_parallel_linear,
    shard_dim,
    shard_heads,
    shard_kv_heads,
    shard_vocab,
    vocab_parallel_embedding,
)
from wslm.backend.modeling.rotary import build_cos_sin_cache
from wslm.backend.quant.linear import apply_linear, finalize, fuse_rows, prepare_weight


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64: where each new token's K/V goes
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    cu_seqlens_q: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32, KV length including the new tokens
    logits_indices: torch.Tensor  # [num_sampled] int64: last token of each sequence that samples
    max_seqlen_q: int = 0  # host-side maxima spare the kernels a device sync
    max_seqlen_k: int = 0


class LlamaLayerWeights:
    __slots__ = ("qkv", "qkv_bias", "o", "gate_up", "down", "input_norm", "post_norm")

    def __init__(self) -> None:
        self.qkv_bias = None


class LlamaModel:
    """Plain tensors rather than nn.Modules: the engine never trains, and a flat layout keeps the
    per-layer Python overhead small."""

    def __init__(self, cfg, device: torch.device, kernel_backend: str | None = None) -> None:
        self.cfg = cfg
        self.device = device
        self.dtype = cfg.dtype
        self.backend = kernel_backend
        # Under tensor parallelism this rank runs its share of the heads (sharding.py).
        self.num_heads = local_num_heads(cfg.num_heads)
        self.num_kv_heads = local_num_kv_heads(cfg.num_kv_heads)
        self.q_size = self.num_heads * cfg.head_dim
        self.kv_size = self.num_kv_heads * cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        self.layers = [LlamaLayerWeights() for _ in range(cfg.num_layers)]
        self.embed: torch.Tensor | None = None
        self.norm: torch.Tensor | None = None
        self.lm_head: torch.Tensor | None = None
        max_pos = max(cfg.max_position_embeddings, cfg.max_model_len or 0)
        self.cos_sin_cache = build_cos_sin_cache(cfg.head_dim, max_pos, cfg.rope_theta, cfg.rope_scaling).to(
            device
        )

    # ---- weights -------------------------------------------------------------------------------
    def load_weights(self, weights) -> None:
        """weights: iterable of (hf_name, tensor). q/k/v and gate/up are fused as they arrive."""
        pending: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
        fuse = {
            "self_attn.q_proj.weight": ("qkv", "q"), "self_attn.k_proj.weight": ("qkv", "k"),
            "self_attn.v_proj.weight": ("qkv", "v"), "self_attn.q_proj.bias": ("qkv_bias", "q"),
            "self_attn.k_proj.bias": ("qkv_bias", "k"), "self_attn.v_proj.bias": ("qkv_bias", "v"),
            "mlp.gate_proj.weight": ("gate_up", "gate"), "mlp.up_proj.weight": ("gate_up", "up"),
        }  # fmt: skip
        single = {
            "self_attn.o_proj.weight": "o", "mlp.down_proj.weight": "down",
            "input_layernorm.weight": "input_norm", "post_attention_layernorm.weight": "post_norm",
        }  # fmt: skip
        order = {"qkv": ("q", "k", "v"), "qkv_bias": ("q", "k", "v"), "gate_up": ("gate", "up")}
        for name, tensor in weights:
            if "rotary_emb" in name:
                continue
            tensor = self._shard(name, tensor)
            # Quantized weights (GGUF, AWQ, GPTQ, int8/int4 on the fly) are packed as they arrive, so the
            # model never exists whole in full precision.
            if name.endswith(".weight") and "norm" not in name:
                tensor = prepare_weight(tensor, getattr(self.cfg, "quantization", None), name, self.device, self.dtype)
            elif isinstance(tensor, torch.Tensor):
                tensor = tensor.to(device=self.device, dtype=self.dtype)
            if name == "model.embed_tokens.weight":
                self.embed = tensor
            elif name == "model.norm.weight":
                self.norm = tensor
            elif name == "lm_head.weight":
                if not self.cfg.tie_word_embeddings:  # tied: one tensor serves both (set below)
                    self.lm_head = tensor
            elif name.startswith("model.layers."):
                idx_str, rest = name[len("model.layers.") :].split(".", 1)
                layer = self.layers[int(idx_str)]
                if rest in single:
                    setattr(layer, single[rest], tensor)
                elif rest in fuse:
                    slot, part = fuse[rest]
                    parts = pending.setdefault((int(idx_str), slot), {})
                    parts[part] = tensor
                    if len(parts) == len(order[slot]):
                        fused = fuse_rows([parts[p] for p in order[slot]])
                        setattr(layer, slot, finalize(fused, self.device, self.dtype))
                        del pending[(int(idx_str), slot)]
        if self.lm_head is None and self.cfg.tie_word_embeddings:
            self.lm_head = self.embed
        self._check_loaded(pending)

    def _shard(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """This rank's part of a checkpoint tensor (all of it without tensor parallelism)."""
        if get_tp_size() == 1:
            return t
        if not isinstance(t, torch.Tensor):
            # Quantized shards (scales split with their rows/groups) are not written yet: under tensor
            # parallelism a GGUF/AWQ/GPTQ weight runs dequantized (int8/int4 on the fly still apply after).
            t = t.dequantize(torch.float32)
        cfg = self.cfg
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            return shard_vocab(t, cfg.vocab_size)
        if ".q_proj." in name:
            return shard_heads(t, cfg.num_heads, cfg.head_dim)
        if ".k_proj." in name or ".v_proj." in name:
            return shard_kv_heads(t, cfg.num_kv_heads, cfg.head_dim)
        if ".gate_proj." in name or ".up_proj." in name:
            return shard_dim(t, 0)
        if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
            return shard_dim(t, 1)
        return t

    def _check_loaded(self, pending) -> None:
        missing = [n for n in ("embed", "norm", "lm_head") if getattr(self, n) is None]
        for i, layer in enumerate(self.layers):
            for n in ("qkv", "o", "gate_up", "down", "input_norm", "post_norm"):
                if not hasattr(layer, n):
                    missing.append(f"layers.{i}.{n}")
            if self.cfg.qkv_bias and layer.qkv_bias is None:
                missing.append(f"layers.{i}.qkv_bias")
        if missing or pending:
            raise ValueError(
                f"The checkpoint is missing weights for {self.cfg.architecture}: {missing[:6]}"
                f"{' ...' if len(missing) > 6 else ''}. Is the download complete?"
            )

    # ---- forward -------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, input_ids, positions, meta: AttentionMetadata, kv_caches) -> torch.Tensor:
        """Returns logits [num_sampled, vocab] (fp32) for meta.logits_indices."""
        last = self.forward_hidden(input_ids, positions, meta, kv_caches)
        return parallel_lm_head(last, self.lm_head, self.cfg.vocab_size).float()

    @torch.inference_mode()
    def forward_hidden(self, input_ids, positions, meta: AttentionMetadata, kv_caches) -> torch.Tensor:
        """The final normed hidden states [num_sampled, hidden] at meta.logits_indices: what the LM head
        reads, and what embedding models pool (decoder_pooling.py)."""
        cfg = self.cfg
        be = self.backend
        hidden = vocab_parallel_embedding(input_ids, self.embed)
        residual = None
        num_tokens = hidden.shape[0]
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            if residual is None:
                residual = hidden
                hidden = kernels.rms_norm(hidden, layer.input_norm, cfg.rms_norm_eps, backend=be)
            else:
                hidden, residual = kernels.rms_norm(
                    hidden, layer.input_norm, cfg.rms_norm_eps, residual=residual, backend=be
                )
            qkv = apply_linear(hidden, layer.qkv, layer.qkv_bias)
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            # Strided slices of qkv go straight to the kernels (both backends take them): no copies.
            q, k = kernels.rotary_embedding(positions, q, k, self.cos_sin_cache, cfg.head_dim, backend=be)
            q = q.view(num_tokens, self.num_heads, cfg.head_dim)
            k = k.view(num_tokens, self.num_kv_heads, cfg.head_dim)
            v = v.view(num_tokens, self.num_kv_heads, cfg.head_dim)
            kernels.reshape_and_cache(k, v, k_cache, v_cache, meta.slot_mapping, backend=be)
            attn = kernels.paged_attention(
                q, k_cache, v_cache, meta.block_tables, meta.cu_seqlens_q, meta.seq_lens, self.scale,
                backend=be, max_seqlen_q=meta.max_seqlen_q, max_seqlen_k=meta.max_seqlen_k,
            )
            hidden = row_parallel_linear(attn.reshape(num_tokens, self.q_size), layer.o)
            hidden, residual = kernels.rms_norm(
                hidden, layer.post_norm, cfg.rms_norm_eps, residual=residual, backend=be
            )
            gate_up = apply_linear(hidden, layer.gate_up)
            gate, up = gate_up.chunk(2, dim=-1)
            hidden = row_parallel_linear(F.silu(gate) * up, layer.down)
        last = (hidden + residual).index_select(0, meta.logits_indices)
        return kernels.rms_norm(last, self.norm, cfg.rms_norm_eps, backend=be)
