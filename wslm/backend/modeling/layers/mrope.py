"""Multimodal rotary position embedding (Qwen2.5-VL's M-RoPE): each token has three positions (temporal,
height, width) and the rotary frequencies are split in three sections (mrope_section, e.g. [16, 24, 24] of a
128-dim head's 64), each rotated by its own position. Text tokens have three equal positions, which is plain
rope with the same table: so 1-D positions (text, decode: the token index + the sequence's M-RoPE delta,
multimodal.rope_positions) run unchanged through every rope path, the CPU decode back ends and CUDA graphs
included. Only a step with image tokens passes [3, N] positions (image_positions), and this layer then builds
the step's rows of the table once, each frequency from its section's position, and rotates with those."""

from __future__ import annotations

import torch

from wslm import kernels
from wslm.backend.modeling.layers.rotary import RotaryEmbedding


class MRotaryEmbedding(RotaryEmbedding):
    def __init__(self, head_dim: int, cos_sin_cache: torch.Tensor, mrope_section: list[int],
                 backend: str | None) -> None:
        super().__init__(head_dim, cos_sin_cache, True, backend)
        half = cos_sin_cache.shape[-1] // 2
        if sum(mrope_section) != half:
            raise ValueError(f"mrope_section {mrope_section} does not cover the {half} rotary frequencies.")
        section = torch.repeat_interleave(torch.arange(3), torch.tensor(mrope_section))
        self.section = torch.cat([section, section]).to(cos_sin_cache.device)  # cos half, then sin half
        self._step: tuple[torch.Tensor, torch.Tensor] | None = None

    def __call__(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        if positions.dim() == 1:
            return super().__call__(positions, q, k)
        # Every layer of a step gets the same [3, N] tensor: its table rows are built once.
        if self._step is None or self._step[0] is not positions:
            rows = self.cos_sin_cache[positions]  # [3, N, rot]
            index = self.section.view(1, 1, -1).expand(1, rows.shape[1], -1)
            self._step = (positions, rows.gather(0, index)[0].contiguous())
        table = self._step[1]
        if self.backend is None:
            self.backend = kernels.selected_backend(q.device)
        steps = torch.arange(table.shape[0], device=table.device)
        return kernels.rotary_embedding(steps, q, k, table, self.head_dim, True, backend=self.backend)


def image_positions(positions: torch.Tensor, images: list) -> torch.Tensor:
    """[3, N] M-RoPE positions of a step whose rows `images` (worker/image_embeds.image_rows: row, first, end
    index into the image's tokens, ImageInput, sequence) are image tokens: every row's three positions are its
    1-D one, except an image token's, which are its first token's position + its (t, h, w) in the image's grid
    (HF's get_vision_position_ids with a time interval of 1 for images)."""
    out = positions.unsqueeze(0).repeat(3, 1)
    for row, first, last, im, _ in images:
        if im.grid is None:
            continue
        _, h, w = im.grid
        j = torch.arange(first, last, device=positions.device)
        base = positions[row] - first  # the image's first token's position
        out[0, row : row + last - first] = base + j // (h * w)
        out[1, row : row + last - first] = base + (j // w) % h
        out[2, row : row + last - first] = base + j % w
    return out
