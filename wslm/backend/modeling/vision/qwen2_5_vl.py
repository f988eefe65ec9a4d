"""Qwen2.5-VL's vision transformer (transformers' Qwen2_5_VisionTransformerPretrainedModel), plain tensors:
- patch embedding: a Conv3d over (temporal_patch_size, patch, patch) with stride = kernel, i.e. one matrix on
  each flattened patch row the processor gives (pixel_values [patches, C * T * P * P]);
- a 2-D rotary embedding inside the ViT: half the rotated frequencies follow a patch's row, half its column;
- blocks of RMSNorm, attention (fused qkv with bias) and a gated SiLU MLP; most attend within windows of
  window_size px (tokens reordered window by window), the fullatt_block_indexes ones across the whole image;
- the patch merger: RMSNorm, then each spatial_merge_size^2 patches (adjacent in the processor's order)
  concatenated through a GELU MLP to one text-model embedding; the window order is undone at the end."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from wslm.backend.modeling.vision.clip import Weights

_ACTS = {"silu": F.silu, "gelu": F.gelu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
         "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x)}


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def patch_positions(t: int, h: int, w: int, merge: int) -> torch.Tensor:
    """(row, column) of each patch [t * h * w, 2] in the processor's order: merge x merge blocks, block-major."""
    hpos = torch.arange(h).view(h // merge, merge, 1, 1).expand(-1, -1, w // merge, merge)
    wpos = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, -1, -1)
    hpos = hpos.permute(0, 2, 1, 3).flatten()
    wpos = wpos.permute(0, 2, 1, 3).flatten()
    return torch.stack([hpos, wpos], dim=-1).repeat(t, 1)


def window_index(t: int, h: int, w: int, merge: int, window: int) -> tuple[torch.Tensor, list[int]]:
    """The merged tokens (llm grid t x h/merge x w/merge) reordered window by window (windows of `window`
    tokens a side, the last ones cut short by the grid's edge), and each window's length in patches."""
    gh, gw = h // merge, w // merge
    index = torch.arange(t * gh * gw).view(t, gh, gw)
    order, lengths = [], []
    for f in range(t):
        for r in range(0, gh, window):
            for c in range(0, gw, window):
                part = index[f, r : r + window, c : c + window].flatten()
                order.append(part)
                lengths.append(part.numel() * merge * merge)
    return torch.cat(order), lengths


def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Bidirectional attention within consecutive segments of the given lengths; q, k, v [N, heads, d]. Segments
    of one length run as one batch."""
    out = torch.empty_like(q)
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    by_len: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        by_len.setdefault(n, []).append(starts[i])
    for n, firsts in by_len.items():
        idx = (torch.tensor(firsts, device=q.device).view(-1, 1) + torch.arange(n, device=q.device)).flatten()
        qs, ks, vs = (x[idx].view(len(firsts), n, *x.shape[1:]).transpose(1, 2) for x in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs)
        out[idx] = o.transpose(1, 2).reshape(-1, *q.shape[1:])
    return out


class Qwen25VisionTower:
    def __init__(self, vision_config, device: torch.device, dtype: torch.dtype) -> None:
        c = vision_config
        self.hidden = c.hidden_size
        self.num_heads = c.num_heads
        self.head_dim = c.hidden_size // c.num_heads
        self.depth = c.depth
        self.patch = c.patch_size
        self.merge = c.spatial_merge_size
        self.window = c.window_size // c.spatial_merge_size // c.patch_size  # in merged tokens
        self.full = set(c.fullatt_block_indexes)
        self.act = _ACTS[c.hidden_act]
        rope = getattr(c, "rope_parameters", None) or {}
        theta = float(rope.get("rope_theta", 10000.0))
        dim = self.head_dim // 2  # rows and columns each rotate half the head
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        self.device, self.dtype = device, dtype
        self.w = Weights(device, dtype)

    def weight_names(self) -> list[str]:
        names = ["patch_embed.proj.weight", "merger.ln_q.weight", "merger.mlp.0.weight", "merger.mlp.0.bias",
                 "merger.mlp.2.weight", "merger.mlp.2.bias"]
        for i in range(self.depth):
            p = f"blocks.{i}"
            names += [f"{p}.norm1.weight", f"{p}.norm2.weight"]
            for part in ("attn.qkv", "attn.proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
                names += [f"{p}.{part}.weight", f"{p}.{part}.bias"]
        return names

    def loaders(self, prefix: str) -> dict:
        return self.w.loaders(prefix, self.weight_names())

    @torch.inference_mode()
    def __call__(self, pixel_values: torch.Tensor, grid_thw: tuple[int, int, int]) -> torch.Tensor:
        """One image's embeddings [t * h * w / merge^2, out_hidden] from its patch rows and (t, h, w) in patches."""
        w = self.w
        t, h, wd = grid_thw
        unit = self.merge * self.merge
        x = F.linear(pixel_values.to(self.device, self.dtype), w["patch_embed.proj.weight"].reshape(self.hidden, -1))
        order, window_lengths = window_index(t, h, wd, self.merge, self.window)
        order = order.to(self.device)
        n = x.shape[0]
        x = x.view(n // unit, unit, -1)[order].reshape(n, -1)
        pos = patch_positions(t, h, wd, self.merge).to(self.device)
        freqs = pos[..., None].float() * self.inv_freq.to(self.device)  # [n, 2, dim / 2]
        freqs = torch.cat([freqs[:, 0], freqs[:, 1]], dim=-1)
        freqs = freqs.view(n // unit, unit, -1)[order].reshape(n, -1)
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        full_lengths = [h * wd] * t
        for i in range(self.depth):
            x = x + self._attention(i, _rms(x, w[f"blocks.{i}.norm1.weight"]), cos, sin,
                                    full_lengths if i in self.full else window_lengths)
            p = f"blocks.{i}.mlp"
            y = _rms(x, w[f"blocks.{i}.norm2.weight"])
            gate = self.act(F.linear(y, w[f"{p}.gate_proj.weight"], w[f"{p}.gate_proj.bias"]))
            up = F.linear(y, w[f"{p}.up_proj.weight"], w[f"{p}.up_proj.bias"])
            x = x + F.linear(gate * up, w[f"{p}.down_proj.weight"], w[f"{p}.down_proj.bias"])
        x = _rms(x, w["merger.ln_q.weight"]).view(n // unit, -1)
        x = F.gelu(F.linear(x, w["merger.mlp.0.weight"], w["merger.mlp.0.bias"]))
        x = F.linear(x, w["merger.mlp.2.weight"], w["merger.mlp.2.bias"])
        return x[torch.argsort(order)]

    def _attention(self, i: int, x: torch.Tensor, cos, sin, lengths: list[int]) -> torch.Tensor:
        w = self.w
        p = f"blocks.{i}.attn"
        n = x.shape[0]
        q, k, v = F.linear(x, w[f"{p}.qkv.weight"], w[f"{p}.qkv.bias"]).view(n, 3, self.num_heads, -1).unbind(1)
        qf, kf = q.float(), k.float()
        q = (qf * cos + _rotate_half(qf) * sin).to(x.dtype)
        k = (kf * cos + _rotate_half(kf) * sin).to(x.dtype)
        out = segment_attention(q, k, v, lengths)
        return F.linear(out.reshape(n, -1), w[f"{p}.proj.weight"], w[f"{p}.proj.bias"])
