"""Rotary position embedding: one cos|sin table per (dims, base, scaling), in vLLM's layout, applied by
wslm.kernels.rotary_embedding.

Scaling types follow HF's rope_type names: default, linear, llama3, dynamic, yarn, longrope (also "su").
Partial rotary (Phi-3/4-mini, GPT-NeoX style models) rotates only the first rotary_dim dims of each head.

Two types that HF recomputes per forward are made static here, by position, so that a token's rotation
never depends on the rest of its batch:
- longrope: positions below original_max_position_embeddings use short_factor, later ones long_factor
  (HF switches the whole sequence to long_factor once it passes the original length);
- dynamic NTK: positions inside the original context keep the unscaled frequencies (as HF does while the
  sequence fits); positions past it use the base scaled for the table's full length (vLLM's choice)."""

from __future__ import annotations

import math

import torch

from wslm import kernels


def _inv_freq(rotary_dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor = float(scaling["factor"])
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    old_len = float(scaling.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn(rotary_dim: int, base: float, scaling: dict, max_positions: int) -> tuple[torch.Tensor, float]:
    """YaRN (HF's _compute_yarn_parameters): frequencies blended between interpolation and extrapolation
    by a ramp over the dims, and cos/sin scaled by the attention factor."""
    original = float(scaling["original_max_position_embeddings"])
    factor = scaling.get("factor") or max_positions / original
    factor = float(factor)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = scaling.get("attention_factor")
    if attn is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attn = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return rotary_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    pos_freqs = base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    inv = (1 / (factor * pos_freqs)) * (1 - extrapolation) + (1 / pos_freqs) * extrapolation
    return inv, float(attn)


def _longrope_attention_factor(scaling: dict, max_positions: int) -> float:
    original = int(scaling["original_max_position_embeddings"])
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = scaling.get("factor") or max_positions / original
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original))


def _table(inv_freq: torch.Tensor, positions: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    freqs = torch.outer(positions, inv_freq)
    return torch.cat([freqs.cos() * scale, freqs.sin() * scale], dim=-1)


def build_cos_sin_cache(
    rotary_dim: int,
    max_positions: int,
    theta: float,
    scaling: dict | None,
    model_max_positions: int | None = None,
) -> torch.Tensor:
    """[max_positions, rotary_dim]: cos in the first half of the last dim, sin in the second (fp32).

    model_max_positions is the config's max_position_embeddings (longrope and yarn derive their factor from
    it when the config gives none); defaults to max_positions."""
    model_max = model_max_positions or max_positions
    positions = torch.arange(max_positions, dtype=torch.float64)
    inv_freq = _inv_freq(rotary_dim, theta)
    rope_type = (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default"
    if rope_type == "default":
        return _table(inv_freq, positions).float()
    if rope_type == "llama3":
        return _table(_llama3_inv_freq(inv_freq, scaling), positions).float()
    if rope_type == "linear":
        return _table(inv_freq, positions / float(scaling["factor"])).float()
    if rope_type == "yarn":
        inv, attn = _yarn(rotary_dim, theta, scaling, model_max)
        return _table(inv, positions, attn).float()
    if rope_type in ("longrope", "su"):
        original = int(scaling["original_max_position_embeddings"])
        attn = _longrope_attention_factor(scaling, model_max)
        short = inv_freq / torch.tensor(scaling["short_factor"], dtype=torch.float64)
        long = inv_freq / torch.tensor(scaling["long_factor"], dtype=torch.float64)
        table = _table(short, positions, attn)
        table[original:] = _table(long, positions[original:], attn)
        return table.float()
    if rope_type == "dynamic":
        original = int(scaling.get("original_max_position_embeddings") or model_max)
        factor = float(scaling["factor"])
        table = _table(inv_freq, positions)
        if max_positions > original:
            length = max(max_positions, original)
            base = theta * ((factor * length / original) - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))
            table[original:] = _table(_inv_freq(rotary_dim, base), positions[original:])
        return table.float()
    raise ValueError(
        f"rope_scaling type {rope_type!r} is not supported yet (supported: default, linear, llama3, dynamic, "
        "yarn, longrope)."
    )


class RotaryEmbedding:
    """Rotates q and k in place: the first rotary_dim dims of each head_dim-wide head."""

    def __init__(
        self, head_dim: int, cos_sin_cache: torch.Tensor, is_neox_style: bool, backend: str | None
    ) -> None:
        self.head_dim = head_dim
        self.cos_sin_cache = cos_sin_cache
        self.is_neox_style = is_neox_style
        self.backend = backend

    def __call__(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        if self.backend is None:  # chosen once (by device and WSLM_KERNEL_BACKEND), not on every call
            self.backend = kernels.selected_backend(q.device)
        return kernels.rotary_embedding(
            positions, q, k, self.cos_sin_cache, self.head_dim, self.is_neox_style, backend=self.backend
        )


def _freeze(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def get_rope(
    head_dim: int,
    rotary_dim: int,
    max_positions: int,
    theta: float,
    scaling: dict | None,
    device: torch.device,
    *,
    is_neox_style: bool = True,
    model_max_positions: int | None = None,
    backend: str | None = None,
    tables: dict | None = None,
) -> RotaryEmbedding:
    """A RotaryEmbedding. Pass one `tables` dict per model so that its layers share each table (a
    128k-position table is tens of MB; a global cache would outlive the model)."""
    key = (
        rotary_dim,
        max_positions,
        float(theta),
        _freeze(scaling) if scaling else None,
        model_max_positions,
    )
    table = tables.get(key) if tables is not None else None
    if table is None:
        table = build_cos_sin_cache(rotary_dim, max_positions, theta, scaling, model_max_positions).to(device)
        if tables is not None:
            tables[key] = table
    return RotaryEmbedding(head_dim, table, is_neox_style, backend)
