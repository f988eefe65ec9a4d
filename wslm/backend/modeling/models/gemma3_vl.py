"""Gemma 3 with its image tower (transformers' Gemma3ForConditionalGeneration): a SigLIP vision tower, the
projector (average-pool the patch grid to mm_tokens_per_image, Gemma RMSNorm, one matrix) and the Gemma 3
text model. Image tokens attend bidirectionally within their image, as transformers masks them
(layers/image_attention.py). A checkpoint without its image processor's settings serves text only (the
vision weights are skipped, as before)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from wslm.backend.modeling.models.gemma3 import Gemma3ForCausalLM
from wslm.backend.modeling.vision import has_image_processor
from wslm.backend.modeling.vision.clip import Weights
from wslm.backend.modeling.vision.siglip import SiglipVisionTower

_VISION_PREFIXES = (
    ("model.vision_tower.vision_model.", "vision_tower."),
    ("vision_tower.vision_model.", "vision_tower."),
    ("model.vision_tower.", "vision_tower."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
    ("multi_modal_projector.", "multi_modal_projector."),
    ("vision_tower.", "vision_tower."),
)


class Gemma3ForConditionalGeneration(Gemma3ForCausalLM):
    takes_images = True
    bidirectional_images = True

    def __init__(self, cfg, device: torch.device, kernel_backend: str | None = None) -> None:
        super().__init__(cfg, device, kernel_backend)
        self.vision_tower = None
        self.mmproj = None
        if getattr(cfg, "mmproj", None):  # a text GGUF with llama.cpp's mmproj file (vision/mmproj.py)
            self._init_mmproj(cfg.mmproj, device)
            return
        if not has_image_processor(cfg.path):
            return
        from transformers import AutoConfig

        hf = AutoConfig.from_pretrained(cfg.path)
        vc = hf.vision_config
        self.vision_tower = SiglipVisionTower(vc, device, self.dtype)
        self.projector = Weights(device, self.dtype)
        self.patches_per_side = vc.image_size // vc.patch_size
        self.pool = self.patches_per_side // int(hf.mm_tokens_per_image**0.5)
        self.projector_eps = vc.layer_norm_eps

    def _init_mmproj(self, path: str, device: torch.device) -> None:
        """clip.cpp's SigLIP graph with the gemma3 projector: pool the patch grid by the file's scale factor
        (4 unless it says otherwise), RMS-norm, one matrix."""
        from wslm.backend.modeling.vision.mmproj import read_mmproj

        info = read_mmproj(path)
        self.mmproj = info
        self.vision_tower = SiglipVisionTower(info.vision_config(), device, self.dtype)
        self.projector = Weights(device, self.dtype)
        self.patches_per_side = info.image_size // info.patch_size
        self.pool = info.scale_factor
        self.projector_eps = info.eps

    def load_weights(self, weights) -> None:
        from wslm.backend.modeling.vision.mmproj import with_projector

        super().load_weights(with_projector(weights, self.mmproj))

    def checkpoint_name(self, name: str) -> str | None:
        if self.vision_tower is not None:
            for old, new in _VISION_PREFIXES:
                if name.startswith(old):
                    return new + name[len(old):]
        return super().checkpoint_name(name)

    def weight_loaders(self):
        out = super().weight_loaders()
        if self.vision_tower is not None:
            out.update(self.vision_tower.loaders("vision_tower"))
            out.update(self.projector.loaders("multi_modal_projector",
                                              ["mm_input_projection_weight", "mm_soft_emb_norm.weight"]))
        return out

    @torch.inference_mode()
    def embed_image(self, data: dict) -> torch.Tensor:
        """One image's embeddings [mm_tokens_per_image, hidden] from pixel_values [1, 3, H, W]."""
        x = self.vision_tower.last_hidden_state(data["pixel_values"].to(self.device))
        n, _, hidden = x.shape
        x = x.transpose(1, 2).reshape(n, hidden, self.patches_per_side, self.patches_per_side)
        x = F.avg_pool2d(x, self.pool, self.pool).flatten(2).transpose(1, 2)
        p = self.projector
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.projector_eps)
        x = (xf * (1.0 + p["mm_soft_emb_norm.weight"].float())).to(self.dtype)
        return (x @ p["mm_input_projection_weight"]).reshape(-1, self.cfg.hidden_size)
