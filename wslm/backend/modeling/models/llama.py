"""Llama-family decoder (Llama 2/3, SmolLM, Mistral, Qwen2) over a flattened, variable-length batch.

All sequences of a step are concatenated into one [num_tokens, hidden] tensor; attention reads and writes
the paged KV cache through layers/attention.py. Other families reuse these blocks (Qwen3 adds q/k norms,
Phi-3 loads fused checkpoints) or subclass them (Gemma)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

import torch

from wslm.backend.distributed.sharding import local_num_heads, local_num_kv_heads
from wslm.backend.modeling.layers.activation import get_act_and_mul, silu_and_mul
from wslm.backend.modeling.layers.attention import Attention, AttentionMetadata
from wslm.backend.modeling.layers.decode_spec import DecodeEnds, DecodeLayer
from wslm.backend.modeling.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from wslm.backend.modeling.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    get_linear_method,
)
from wslm.backend.modeling.layers.norm import GemmaRMSNorm, HeadRMSNorm, RMSNorm
from wslm.backend.modeling.layers.rotary import get_rope

Loaders = dict[str, Callable[[torch.Tensor], None]]


def renamed(name: str, renames) -> str:
    """name with the first of renames' (old prefix, new prefix) pairs that it starts with replaced: the
    vision-language families map their checkpoints' wrappers onto the text model's names this way."""
    for old, new in renames:
        if name.startswith(old):
            return new + name[len(old):]
    return name


def linear_loaders(prefix: str, layer, parts: dict[str, object]) -> Loaders:
    """Checkpoint names -> loaders for a (possibly fused) linear layer: parts maps each checkpoint
    projection name to its part of the layer (None: the checkpoint already holds the fused tensor)."""
    out: Loaders = {}
    for name, part in parts.items():
        out[f"{prefix}.{name}.weight"] = partial(layer.load, "weight", shard=part)
        if layer.has_bias:
            out[f"{prefix}.{name}.bias"] = partial(layer.load, "bias", shard=part)
    return out


class LlamaAttention:
    def __init__(self, model, layer_idx: int, *, norm_cls: type[RMSNorm] | None = None) -> None:
        cfg, dtype, dev, be = model.cfg, model.dtype, model.device, model.backend
        self.head_dim = cfg.head_dim
        self.qkv_proj = QKVParallelLinear(
            cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads,
            bias=cfg.qkv_bias, method=model.linear_method, dtype=dtype, device=dev,
        )  # fmt: skip
        self.q_size = self.qkv_proj.num_heads * cfg.head_dim
        self.kv_size = self.qkv_proj.num_kv_heads * cfg.head_dim
        self.o_proj = RowParallelLinear(
            cfg.num_heads * cfg.head_dim, cfg.hidden_size, method=model.linear_method, dtype=dtype, device=dev
        )
        # Per-head q/k RMSNorm before rotary (Qwen3, Gemma 3).
        self.q_norm = self.k_norm = None
        if norm_cls is not None:
            self.q_norm = HeadRMSNorm(norm_cls(cfg.rms_norm_eps, dtype, dev, be), cfg.head_dim)
            self.k_norm = HeadRMSNorm(norm_cls(cfg.rms_norm_eps, dtype, dev, be), cfg.head_dim)
        self.rotary_emb = model.rope_for_layer(layer_idx)
        self.attn = Attention(
            self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads, cfg.head_dim, model.attn_scale,
            sliding_window=cfg.layer_sliding_window(layer_idx), logits_soft_cap=model.attn_logit_softcap,
            backend=be,
        )  # fmt: skip

    def loaders(self, prefix: str, fused_qkv: bool = False) -> Loaders:
        parts = {"qkv_proj": None} if fused_qkv else {"q_proj": "q", "k_proj": "k", "v_proj": "v"}
        out = linear_loaders(prefix, self.qkv_proj, parts)
        out[f"{prefix}.o_proj.weight"] = partial(self.o_proj.load, "weight")
        if self.q_norm is not None:
            out[f"{prefix}.q_norm.weight"] = self.q_norm.load
            out[f"{prefix}.k_norm.weight"] = self.k_norm.load
        return out

    def __call__(self, positions, hidden, kv_cache, meta: AttentionMetadata) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        # Strided slices of qkv go straight to the kernels (both backends take them): no copies.
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v, kv_cache, meta))


class LlamaMLP:
    def __init__(self, model, intermediate_size: int | None = None, reduce_results: bool = True) -> None:
        cfg = model.cfg
        inner = intermediate_size or cfg.intermediate_size
        kw = dict(method=model.linear_method, dtype=model.dtype, device=model.device)
        self.gate_up_proj = MergedColumnParallelLinear(cfg.hidden_size, [inner, inner], **kw)
        self.down_proj = RowParallelLinear(inner, cfg.hidden_size, reduce_results=reduce_results, **kw)
        self.act_and_mul = get_act_and_mul(cfg.hidden_act)

    def loaders(self, prefix: str, fused: bool = False) -> Loaders:
        parts = {"gate_up_proj": None} if fused else {"gate_proj": 0, "up_proj": 1}
        out = linear_loaders(prefix, self.gate_up_proj, parts)
        out[f"{prefix}.down_proj.weight"] = partial(self.down_proj.load, "weight")
        return out

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_and_mul(self.gate_up_proj(x)))


class LlamaDecoderLayer:
    def __init__(self, model, layer_idx: int) -> None:
        cfg, dtype, dev, be = model.cfg, model.dtype, model.device, model.backend
        norm = model.norm_cls
        self.self_attn = LlamaAttention(model, layer_idx, norm_cls=norm if model.qk_norm else None)
        self.mlp = LlamaMLP(model)
        self.input_layernorm = norm(cfg.rms_norm_eps, dtype, dev, be)
        self.post_attention_layernorm = norm(cfg.rms_norm_eps, dtype, dev, be)

    def loaders(self, prefix: str, fused: bool = False) -> Loaders:
        return {
            **self.self_attn.loaders(f"{prefix}.self_attn", fused),
            **self.mlp.loaders(f"{prefix}.mlp", fused),
            f"{prefix}.input_layernorm.weight": self.input_layernorm.load,
            f"{prefix}.post_attention_layernorm.weight": self.post_attention_layernorm.load,
        }

    def __call__(self, positions, hidden, residual, kv_cache, meta):
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, kv_cache, meta)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual

    def decode_spec(self) -> DecodeLayer | str:
        """This layer for the CPU decode back ends (layers/decode_spec.py), or why its math is another.
        Subclasses that change __call__ answer for themselves."""
        attn = self.self_attn
        if type(self).__call__ is not LlamaDecoderLayer.__call__ or type(attn).__call__ is not LlamaAttention.__call__:
            return f"layer type {type(self).__name__} computes its own way"
        a = attn.attn
        if a.sliding_window is not None or a.logits_soft_cap is not None or a.sinks is not None:
            return "a sliding window, soft cap or attention sinks"
        rope = attn.rotary_emb
        if not rope.is_neox_style or rope.cos_sin_cache.shape[-1] != attn.head_dim:
            return "GPT-J style or partial rotary"
        norms = [self.input_layernorm, self.post_attention_layernorm]
        if attn.q_norm is not None:
            if type(attn.q_norm) is not HeadRMSNorm or type(attn.k_norm) is not HeadRMSNorm:
                return "q/k norm type"
            if attn.q_norm.norm.eps != attn.k_norm.norm.eps:
                return "q and k norms with different eps"
            norms += [attn.q_norm.norm, attn.k_norm.norm]
        if any(type(n) not in (RMSNorm, GemmaRMSNorm) for n in norms):  # one kernel: Gemma's 1 + w is folded
            return "norm type"
        mlp = self.mlp
        gated = type(mlp) is LlamaMLP and mlp.act_and_mul is silu_and_mul
        return DecodeLayer(
            source=self, input_norm=self.input_layernorm, post_norm=self.post_attention_layernorm,
            qkv_proj=attn.qkv_proj, o_proj=attn.o_proj, q_norm=attn.q_norm, k_norm=attn.k_norm,
            cos_sin_cache=rope.cos_sin_cache, heads=a.num_heads, kv_heads=a.num_kv_heads, head_dim=attn.head_dim,
            q_size=attn.q_size, kv_size=attn.kv_size, scale=a.scale,
            gate_up_proj=mlp.gate_up_proj if gated else None, down_proj=mlp.down_proj if gated else None,
            mlp=None if gated else mlp,
        )  # fmt: skip


class LlamaForCausalLM:
    """Plain tensors rather than nn.Modules: the engine never trains, and a flat layout keeps the
    per-layer Python overhead small. Subclasses set the class attributes below or override a builder."""

    layer_cls: type = LlamaDecoderLayer
    norm_cls: type[RMSNorm] = RMSNorm
    qk_norm = False  # per-head q/k RMSNorm (Qwen3)
    fused_checkpoint = False  # qkv_proj / gate_up_proj stored fused (Phi-3)

    def __init__(self, cfg, device: torch.device, kernel_backend: str | None = None) -> None:
        self.cfg = cfg
        self.device = device
        self.dtype = cfg.dtype
        self.backend = kernel_backend
        # Under tensor parallelism this rank runs its share of the heads (distributed/sharding.py).
        self.num_heads = local_num_heads(cfg.num_heads)
        self.num_kv_heads = local_num_kv_heads(cfg.num_kv_heads)
        self.linear_method = get_linear_method(cfg.quantization)
        self.attn_scale = self.attention_scale()
        self.attn_logit_softcap: float | None = None
        self._rope_tables: dict = {}
        self.init_extra()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, self.dtype, device, cfg.quantization)
        self.layers = [self.layer_cls(self, i) for i in range(cfg.num_layers)]
        self.norm = self.norm_cls(cfg.rms_norm_eps, self.dtype, device, kernel_backend)
        self.lm_head = ParallelLMHead(cfg.vocab_size, self.dtype, device, cfg.quantization)

    # ---- family hooks ---------------------------------------------------------------------------
    @classmethod
    def config_overrides(cls, hf_config) -> dict:
        """ModelConfig fields this family sets from its HF (text) config beyond the common ones."""
        return {}

    def init_extra(self) -> None:
        """Family settings read before the layers are built (Gemma: softcaps, embedding scale)."""

    def attention_scale(self) -> float:
        return self.cfg.head_dim**-0.5

    def rope_for_layer(self, layer_idx: int):
        cfg = self.cfg
        return get_rope(
            cfg.head_dim, cfg.rotary_dim, max(cfg.max_position_embeddings, cfg.max_model_len or 0), cfg.rope_theta,
            cfg.rope_scaling, self.device, model_max_positions=cfg.max_position_embeddings, backend=self.backend,
            tables=self._rope_tables,
        )  # fmt: skip

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def compute_logits(self, hidden: torch.Tensor, float32: bool = False) -> torch.Tensor:
        """float32: every row's logits from the head's unrounded sums (prompt_logprobs steps); else a few
        rows are (where the head's kernel gives them so) and the rest are the product in the model's dtype."""
        return self.lm_head(hidden, float32).float()

    # ---- weights --------------------------------------------------------------------------------
    def checkpoint_name(self, name: str) -> str | None:
        """Map a checkpoint tensor name to ours; None skips it (rotary tables, other towers)."""
        return None if "rotary_emb" in name else name

    def weight_loaders(self) -> Loaders:
        out: Loaders = {
            "model.embed_tokens.weight": self.embed_tokens.load,
            "model.norm.weight": self.norm.load,
        }
        if not self.cfg.tie_word_embeddings:  # tied checkpoints may still carry lm_head.weight: ignored
            out["lm_head.weight"] = self.lm_head.load
        for i, layer in enumerate(self.layers):
            out.update(layer.loaders(f"model.layers.{i}", self.fused_checkpoint))
        return out

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """weights: iterable of (hf_name, tensor), one at a time (a checkpoint is never held whole)."""
        loaders = self.weight_loaders()
        seen: set[str] = set()
        for name, tensor in weights:
            ours = self.checkpoint_name(name)
            if ours is None or (ours == "lm_head.weight" and self.cfg.tie_word_embeddings):
                continue
            loader = loaders.get(ours)
            if loader is None:
                continue  # e.g. a vision tower's weights, which the text model does not use
            loader(tensor)  # each layer slices its tensor-parallel share, then moves it to the device
            seen.add(ours)
        if self.cfg.tie_word_embeddings:
            self.lm_head.tie_to(self.embed_tokens)
        missing = [n for n in loaders if n not in seen]
        if missing:
            raise ValueError(
                f"The checkpoint is missing weights for {self.cfg.architecture}: {missing[:6]}"
                f"{' ...' if len(missing) > 6 else ''}. Is the download complete?"
            )

    # ---- forward --------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, input_ids, positions, meta: AttentionMetadata, kv_caches, inputs_embeds=None) -> torch.Tensor:
        """Returns logits [num_sampled, vocab] (fp32) for meta.logits_indices. inputs_embeds: the step's input
        embeddings when they are not the tokens' own (image tokens, worker/image_embeds.py)."""
        hidden = self.forward_hidden(input_ids, positions, meta, kv_caches, inputs_embeds)
        return self.compute_logits(hidden, meta.prompt_logprobs)

    @torch.inference_mode()
    def decode_layers(self) -> list[DecodeLayer] | str:
        """Every layer for the CPU decode back ends (layers/decode_spec.py), or why they cannot compute
        this model: they run embed -> layers -> norm -> compute_logits as forward_hidden does."""
        if type(self).forward_hidden is not LlamaForCausalLM.forward_hidden:
            return "the model runs its own forward"
        specs = []
        for layer in self.layers:
            spec = layer.decode_spec()
            if isinstance(spec, str):
                return spec
            if specs and spec.cos_sin_cache is not specs[0].cos_sin_cache:
                return "per-layer rotary"
            specs.append(spec)
        return specs

    def decode_ends(self) -> DecodeEnds | str:
        """The token table, final norm and head for a back end that freezes the whole decode step
        (layers/decode_spec.py), or why embed / compute_logits are more than a lookup and a product."""
        cls = type(self)
        if cls.embed is not LlamaForCausalLM.embed or cls.compute_logits is not LlamaForCausalLM.compute_logits:
            return "the model embeds tokens or computes logits its own way"
        return DecodeEnds(embed_table=self.embed_tokens.weight, final_norm=self.norm, head=self.lm_head.weight)

    def forward_hidden(self, input_ids, positions, meta: AttentionMetadata, kv_caches,
                       inputs_embeds=None) -> torch.Tensor:
        """The final normed hidden states [num_sampled, hidden] at meta.logits_indices: what the LM head
        reads, and what embedding models pool (pooling/decoder.py)."""
        hidden = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches):
            hidden, residual = layer(positions, hidden, residual, kv_cache, meta)
        last = (hidden + residual).index_select(0, meta.logits_indices)
        return self.norm(last)


# Llama in all but name (Mistral's sliding window is a ModelConfig setting every family honours).
MistralForCausalLM = LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def config_overrides(cls, hf_config) -> dict:
        return {"qkv_bias": True}  # Qwen2 always has q/k/v biases (its config does not say so)
