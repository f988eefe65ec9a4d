"""SmolVLM / Idefics3 (transformers' Idefics3ForConditionalGeneration): a SigLIP-style vision tower (patch
embedding with a bias, learned positions, post-LayerNorm), the connector (pixel shuffle by scale_factor, one
matrix without bias) and a Llama text model. The processor cuts an image into tiles plus a downscaled whole
("global") image, each tile its own run of <image> tokens between row/column markers; each tile is encoded on
its own (as transformers does), so the front end gives every tile its own ImageInput (frontend/placeholders.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from wslm.backend.modeling.models.llama import LlamaForCausalLM, renamed
from wslm.backend.modeling.vision.clip import Weights
from wslm.backend.modeling.vision.siglip import SiglipVisionTower

# transformers 5 nests the parts under model.; 4.x the same names (Idefics3Model: text_model, vision_model).
_RENAMES = (
    ("model.text_model.", "model."),
    ("model.vision_model.", "vision_tower."),
    ("model.connector.modality_projection.proj.", "connector."),
    ("model.connector.modality_projection.", "connector."),
)


class Idefics3ForConditionalGeneration(LlamaForCausalLM):
    takes_images = True

    def __init__(self, cfg, device: torch.device, kernel_backend: str | None = None) -> None:
        super().__init__(cfg, device, kernel_backend)
        self.connector = Weights(device, self.dtype)
        self.mmproj = None
        if getattr(cfg, "mmproj", None):  # a Llama GGUF with llama.cpp's idefics3 mmproj (vision/mmproj.py)
            from wslm.backend.modeling.vision.mmproj import read_mmproj

            self.mmproj = read_mmproj(cfg.mmproj)
            self.vision_tower = SiglipVisionTower(self.mmproj.vision_config(), device, self.dtype)
            self.scale = self.mmproj.scale_factor
            return
        from transformers import AutoConfig

        hf = AutoConfig.from_pretrained(cfg.path)
        self.vision_tower = SiglipVisionTower(hf.vision_config, device, self.dtype)
        self.scale = int(hf.scale_factor)

    def load_weights(self, weights) -> None:
        from wslm.backend.modeling.vision.mmproj import with_projector

        super().load_weights(with_projector(weights, self.mmproj))

    def checkpoint_name(self, name: str) -> str | None:
        name = renamed(name, _RENAMES)
        return super().checkpoint_name(name)

    def weight_loaders(self):
        out = super().weight_loaders()
        out.update(self.vision_tower.loaders("vision_tower"))
        out.update(self.connector.loaders("connector", ["weight"]))
        return out

    @torch.inference_mode()
    def embed_image(self, data: dict) -> torch.Tensor:
        """One tile's embeddings [image_seq_len, hidden] from its pixel_values [1, 3, H, W]."""
        x = self.vision_tower.last_hidden_state(data["pixel_values"].to(self.device))
        n, seq, dim = x.shape
        side, s = int(seq**0.5), self.scale
        # transformers' pixel_shuffle: s x s neighbouring patches become one token of s*s*dim features
        x = x.view(n, side, side // s, dim * s).permute(0, 2, 1, 3)
        x = x.reshape(n, side // s, side // s, dim * s * s).permute(0, 2, 1, 3)
        x = x.reshape(n, seq // (s * s), dim * s * s)
        return F.linear(x, self.connector["weight"]).reshape(-1, self.cfg.hidden_size)
