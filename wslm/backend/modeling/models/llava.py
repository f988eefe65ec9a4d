"""LLaVA-1.5 (transformers' LlavaForConditionalGeneration): a CLIP vision tower, a two-layer MLP projector and
a Llama text model. An image becomes the projector's output for the patches of one vision layer (by default
the second to last, the class token dropped), one embedding per image placeholder token; the text model then
runs as Llama with those embeddings in place of the placeholders' (causal attention throughout)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from wslm.backend.modeling.models.llama import LlamaForCausalLM, renamed
from wslm.backend.modeling.vision.clip import ACTIVATIONS, CLIPVisionTower, Weights

# Checkpoint prefixes (transformers 5 nests everything under model.; 4.x kept language_model. outside).
_RENAMES = (
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
    ("model.vision_tower.", "vision_tower."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
)


class LlavaForConditionalGeneration(LlamaForCausalLM):
    takes_images = True

    def __init__(self, cfg, device: torch.device, kernel_backend: str | None = None) -> None:
        super().__init__(cfg, device, kernel_backend)
        self.projector = Weights(device, self.dtype)
        self.mmproj = None
        if getattr(cfg, "mmproj", None):  # a text GGUF with llama.cpp's mmproj file (vision/mmproj.py)
            self._init_mmproj(cfg.mmproj, device)
            return
        from transformers import AutoConfig

        hf = AutoConfig.from_pretrained(cfg.path)
        if getattr(hf.vision_config, "model_type", "clip_vision_model") != "clip_vision_model":
            raise ValueError(f"LLaVA with a {hf.vision_config.model_type} vision tower is not supported yet "
                             "(wslm runs LLaVA-1.5's CLIP tower).")
        self.vision_tower = CLIPVisionTower(hf.vision_config, device, self.dtype)
        layer = hf.vision_feature_layer
        self.feature_layers = [layer] if isinstance(layer, int) else list(layer)
        self.drop_cls = hf.vision_feature_select_strategy == "default"
        self.projector_act = ACTIVATIONS[hf.projector_hidden_act]
        self.projector_bias = getattr(hf, "multimodal_projector_bias", True)

    def _init_mmproj(self, path: str, device: torch.device) -> None:
        """clip.cpp's LLaVA graph: the hidden states of the feature layers (the file's tower is cut there),
        the class token dropped, the MLP projector (GELU: transformers' erf form, as the checkpoint was
        trained; ggml's is the tanh approximation)."""
        from wslm.backend.modeling.vision.mmproj import read_mmproj

        info = read_mmproj(path)
        self.mmproj = info
        self.vision_tower = CLIPVisionTower(info.vision_config(), device, self.dtype)
        self.feature_layers = list(info.feature_layers)
        self.drop_cls = True
        self.projector_act = ACTIVATIONS["gelu"]
        self.projector_bias = True

    def load_weights(self, weights) -> None:
        from wslm.backend.modeling.vision.mmproj import with_projector

        super().load_weights(with_projector(weights, self.mmproj))

    def checkpoint_name(self, name: str) -> str | None:
        name = renamed(name, _RENAMES)
        if name.startswith("vision_tower."):
            name = name.replace("vision_tower.vision_model.", "vision_tower.")  # 4.x: CLIPVisionModel's wrapper
        return super().checkpoint_name(name)

    def weight_loaders(self):
        out = super().weight_loaders()
        out.update(self.vision_tower.loaders("vision_tower"))
        names = ["linear_1.weight", "linear_2.weight"]
        if self.projector_bias:
            names += ["linear_1.bias", "linear_2.bias"]
        out.update(self.projector.loaders("multi_modal_projector", names))
        return out

    @torch.inference_mode()
    def embed_image(self, data: dict) -> torch.Tensor:
        """One image's embeddings [placeholder tokens, hidden] from the processor's pixel_values [1, 3, H, W]."""
        pixels = data["pixel_values"].to(self.device)
        states = self.vision_tower.hidden_states(pixels, self.feature_layers)
        if self.drop_cls:
            states = [s[:, 1:] for s in states]
        x = torch.cat(states, dim=-1)
        p = self.projector
        x = F.linear(x, p["linear_1.weight"], p.get("linear_1.bias"))
        x = F.linear(self.projector_act(x), p["linear_2.weight"], p.get("linear_2.bias"))
        return x.reshape(-1, x.shape[-1])
