"""Qwen2.5-VL (transformers' Qwen2_5_VLForConditionalGeneration): the Qwen2.5 vision tower
(vision/qwen2_5_vl.py: window attention, 2-D rotary, patch merger; dynamic resolution: the processor sizes
each image between its min and max pixels) and a Qwen2 text model whose rotary positions are M-RoPE
(layers/mrope.py). Causal attention throughout, as in transformers.

Positions: the engine gives each token its 1-D rotary position (multimodal.rope_positions: the index, shifted
back after each image by what the image's grid saves); a step with image tokens turns them into [3, N]
(image_positions, called by the model runner) so that an image's tokens take their grid's (t, h, w)."""

from __future__ import annotations

import torch

from wslm.backend.modeling.layers.mrope import MRotaryEmbedding, image_positions
from wslm.backend.modeling.models.llama import Qwen2ForCausalLM, renamed
from wslm.backend.modeling.vision.qwen2_5_vl import Qwen25VisionTower

# Checkpoint prefixes: the hub's checkpoints (and transformers 5's saves) keep model.* and visual.*;
# transformers 4.5x saved model.language_model.* and model.visual.*.
_RENAMES = (
    ("model.language_model.", "model."),
    ("model.visual.", "visual."),
)


class Qwen2_5_VLForConditionalGeneration(Qwen2ForCausalLM):
    takes_images = True
    mrope = True  # the front end gives each image its token grid (ImageInput.grid)

    @classmethod
    def config_overrides(cls, hf_config) -> dict:
        rope = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
        section = rope.get("mrope_section")
        if not section:
            raise ValueError("This Qwen2.5-VL config has no rope mrope_section (its M-RoPE split of the rotary "
                             "frequencies); is config.json complete?")
        return {**super().config_overrides(hf_config), "extra": {"mrope_section": list(section)}}

    def __init__(self, cfg, device: torch.device, kernel_backend: str | None = None) -> None:
        self._mrope = None
        super().__init__(cfg, device, kernel_backend)
        from transformers import AutoConfig

        hf = AutoConfig.from_pretrained(cfg.path)
        self.visual = Qwen25VisionTower(hf.vision_config, device, self.dtype)

    def rope_for_layer(self, layer_idx: int):
        if self._mrope is None:  # one for every layer: the step's table rows are built once
            plain = super().rope_for_layer(layer_idx)
            if plain.cos_sin_cache.shape[-1] != self.cfg.head_dim:
                raise ValueError("Qwen2.5-VL with partial rotary is not supported.")
            self._mrope = MRotaryEmbedding(self.cfg.head_dim, plain.cos_sin_cache,
                                           self.cfg.extra["mrope_section"], self.backend)
        return self._mrope

    def checkpoint_name(self, name: str) -> str | None:
        name = renamed(name, _RENAMES)
        return super().checkpoint_name(name)

    def weight_loaders(self):
        out = super().weight_loaders()
        out.update(self.visual.loaders("visual"))
        return out

    @torch.inference_mode()
    def embed_image(self, data: dict) -> torch.Tensor:
        """One image's embeddings [tokens, hidden] from the processor's pixel_values [patches, C * T * P * P]
        and image_grid_thw [1, 3] (in patches)."""
        grid = tuple(int(v) for v in data["image_grid_thw"].reshape(-1)[:3])
        return self.visual(data["pixel_values"], grid)

    def image_positions(self, positions: torch.Tensor, images: list) -> torch.Tensor:
        """The step's [3, N] M-RoPE positions (the model runner calls this for a step with image tokens)."""
        return image_positions(positions, images)
