"""Bidirectional attention within an image's tokens (Gemma 3): after the causal paged attention, the query
rows of each image recompute their attention over every key up to the image's end, so each image token sees
the whole image, as transformers' Gemma 3 masks it (full layers: causal OR same image; sliding layers: that AND
the window). Only images whose last token is in this step can be served so (worker/image_embeds.py decides)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attend_image_rows(out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      spans: list[tuple[int, int, int, int]], block_tables: torch.Tensor, scale: float,
                      sliding_window: int | None, softcap: float | None) -> None:
    """out, q: [tokens, heads, head_dim]; spans: (first row, end row, sequence index, position of the first
    row), the rows being image tokens up to their image's last. Rewrites those rows of out in place."""
    block_size = k_cache.shape[1]
    for row0, row1, seq, pos0 in spans:
        end = pos0 + row1 - row0  # keys [0, end): the prompt so far and the whole image
        blocks = block_tables[seq, : -(-end // block_size)].long()
        k = k_cache[blocks].flatten(0, 1)[:end].to(q.dtype).transpose(0, 1)  # [kv_heads, end, head_dim]
        v = v_cache[blocks].flatten(0, 1)[:end].to(q.dtype).transpose(0, 1)
        qh = q[row0:row1].transpose(0, 1)  # [heads, rows, head_dim]
        rep = qh.shape[0] // k.shape[0]
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        scores = (qh.float() @ k.float().transpose(1, 2)) * scale
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        if sliding_window is not None:  # every key before the image's end is visible, within the window
            positions = torch.arange(pos0, end, device=q.device)[:, None]
            keys = torch.arange(end, device=q.device)[None, :]
            scores = scores.masked_fill(positions - keys >= sliding_window, float("-inf"))
        out[row0:row1] = (F.softmax(scores, dim=-1) @ v.float()).transpose(0, 1).to(out.dtype)
