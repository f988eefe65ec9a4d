"""SigLIP's vision transformer (transformers' SiglipVisionTransformer), as Gemma 3 uses it: patch embedding
with a bias and learned positions (no class token, no pre-LayerNorm), CLIP's encoder layers, and the last
layer's output through the post-LayerNorm (the pooling head is not used)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from wslm.backend.modeling.vision.clip import CLIPVisionTower


class SiglipVisionTower(CLIPVisionTower):
    def weight_names(self) -> list[str]:
        return ["embeddings.patch_embedding.weight", "embeddings.patch_embedding.bias",
                "embeddings.position_embedding.weight", "post_layernorm.weight", "post_layernorm.bias",
                *self.layer_weight_names()]

    def embeddings(self, pixel_values: torch.Tensor) -> torch.Tensor:
        w = self.w
        x = F.conv2d(pixel_values.to(w.dtype), w["embeddings.patch_embedding.weight"],
                     w["embeddings.patch_embedding.bias"], stride=self.patch_size)
        x = x.flatten(2).transpose(1, 2)  # [n, patches, hidden]
        return x + w["embeddings.position_embedding.weight"][: x.shape[1]]

    def last_hidden_state(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.hidden_states(pixel_values, [-1])[0]
        w = self.w
        return F.layer_norm(x, (self.hidden,), w["post_layernorm.weight"], w["post_layernorm.bias"], self.eps)
