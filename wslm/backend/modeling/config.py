"""ModelConfig: the architecture facts model code reads, whatever format the checkpoint came in (the loader
fills it), and the rope settings as transformers' configs spell them."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class ModelConfig:
    """The handful of architecture facts our model code needs, read from any source format."""

    name: str
    path: str
    architecture: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    eos_token_ids: frozenset[int]
    dtype: torch.dtype
    max_model_len: int = 0  # resolved by the engine
    # Sliding-window attention: the window in tokens (a query sees itself and the window - 1 before it),
    # for every layer, or for the layers layer_types marks "sliding_attention" when the config has them.
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    rotary_dim: int = 0  # dims of each head that rotate (partial rotary); 0 means head_dim
    hidden_act: str = "silu"
    # None (dense), "gguf", "awq", "gptq", "int8" or "int4": how the linear weights are held
    # (wslm.backend.quant), i.e. which LinearMethod the layers use (modeling/layers/linear.py).
    quantization: str | None = None
    kv_cache_dtype: torch.dtype | None = None  # None: the model dtype; float8_e4m3fn for --kv-cache-dtype fp8
    mmproj: str | None = None  # a text GGUF's llama.cpp vision projector file (modeling/vision/mmproj.py)
    # Family-specific settings (Gemma's softcaps, second rope base, ...), filled by the family class's
    # config_overrides() and read only by that family's code.
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.rotary_dim:
            self.rotary_dim = self.head_dim

    def layer_sliding_window(self, layer_idx: int) -> int | None:
        if self.sliding_window is None:
            return None
        if self.layer_types is None:
            return self.sliding_window
        return self.sliding_window if self.layer_types[layer_idx] == "sliding_attention" else None

    @property
    def uniform_sliding_window(self) -> int | None:
        """The window when every layer has it (the block manager may then free blocks behind it), else None."""
        if self.sliding_window is None:
            return None
        if self.layer_types and any(t != "sliding_attention" for t in self.layer_types):
            return None
        return self.sliding_window

    def kv_bytes_per_token(self, dtype: torch.dtype | None = None) -> int:
        elem = torch.empty(0, dtype=dtype or self.kv_cache_dtype or self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem


def rope_parameters(hf_config) -> dict:
    """The config's rope settings as one dict (rope_theta, rope_type, ...). transformers 5 folds rope_theta
    and rope_scaling into rope_parameters, per layer type for some families (Gemma 3: the full-attention
    entry is returned here); 4.x keeps them apart."""
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    if params and all(isinstance(v, dict) for v in params.values()):
        params = dict(params.get("full_attention") or next(iter(params.values())))
    scaling = getattr(hf_config, "rope_scaling", None)
    if isinstance(scaling, dict):
        params = {**scaling, **params}
    # Phi-3 (4.x configs) keeps longrope's original length beside the scaling dict.
    original = getattr(hf_config, "original_max_position_embeddings", None)
    if original and "original_max_position_embeddings" not in params:
        params["original_max_position_embeddings"] = original
    return params


def rope_settings(params: dict, hf_config=None) -> tuple[float, dict | None]:
    """(theta, scaling or None for plain rope) from rope_parameters()."""
    params = dict(params)
    theta = float(params.pop("rope_theta", None) or getattr(hf_config, "rope_theta", None) or 10000.0)
    params.pop("partial_rotary_factor", None)
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type == "default":
        return theta, None
    params["rope_type"] = rope_type
    return theta, params
