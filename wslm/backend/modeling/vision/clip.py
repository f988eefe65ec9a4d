"""CLIP's vision transformer (transformers' CLIPVisionTransformer), as LLaVA uses it: patch embedding + class
token + learned positions, pre-LayerNorm, encoder layers of bidirectional attention, and the hidden states of a
chosen layer (LLaVA reads the second to last; the post-LayerNorm and pooling are not used)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}


class Weights(dict):
    """name -> tensor on the model's device and dtype; a loader per name for load_weights."""

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.device, self.dtype = device, dtype

    def loaders(self, prefix: str, names: list[str]) -> dict[str, Callable[[torch.Tensor], None]]:
        def setter(name: str):
            return lambda t: self.__setitem__(name, t.to(device=self.device, dtype=self.dtype))

        return {f"{prefix}.{n}": setter(n) for n in names}


class CLIPVisionTower:
    def __init__(self, vision_config, device: torch.device, dtype: torch.dtype) -> None:
        c = vision_config
        self.hidden = c.hidden_size
        self.num_heads = c.num_attention_heads
        self.num_layers = c.num_hidden_layers
        self.patch_size = c.patch_size
        self.eps = c.layer_norm_eps
        self.act = ACTIVATIONS[c.hidden_act]
        self.w = Weights(device, dtype)

    def weight_names(self) -> list[str]:
        names = ["embeddings.class_embedding", "embeddings.patch_embedding.weight",
                 "embeddings.position_embedding.weight", "pre_layrnorm.weight", "pre_layrnorm.bias"]
        return names + self.layer_weight_names()

    def layer_weight_names(self) -> list[str]:
        names = []
        for i in range(self.num_layers):
            p = f"encoder.layers.{i}"
            for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj",
                         "layer_norm1", "layer_norm2", "mlp.fc1", "mlp.fc2"):
                names += [f"{p}.{part}.weight", f"{p}.{part}.bias"]
        return names

    def loaders(self, prefix: str) -> dict:
        return self.w.loaders(prefix, self.weight_names())

    def hidden_states(self, pixel_values: torch.Tensor, layers: list[int]) -> list[torch.Tensor]:
        """The encoder's hidden states after each layer count in `layers` (HF's hidden_states[i]: 0 is the
        embeddings after the pre-LayerNorm, negative counts from the end)."""
        x = self.embeddings(pixel_values)
        wanted = sorted({i % (self.num_layers + 1) for i in layers})
        states = {0: x}
        for i in range(max(wanted)):
            x = self._layer(i, x)
            states[i + 1] = x
        return [states[i % (self.num_layers + 1)] for i in layers]

    def embeddings(self, pixel_values: torch.Tensor) -> torch.Tensor:
        w = self.w
        x = F.conv2d(pixel_values.to(w.dtype), w["embeddings.patch_embedding.weight"], stride=self.patch_size)
        x = x.flatten(2).transpose(1, 2)  # [n, patches, hidden]
        cls = w["embeddings.class_embedding"].expand(x.shape[0], 1, -1)
        x = torch.cat([cls, x], dim=1)
        x = x + w["embeddings.position_embedding.weight"][: x.shape[1]]
        return F.layer_norm(x, (self.hidden,), w["pre_layrnorm.weight"], w["pre_layrnorm.bias"], self.eps)

    def _layer(self, i: int, x: torch.Tensor) -> torch.Tensor:
        w, p = self.w, f"encoder.layers.{i}"

        def lin(name, t):
            return F.linear(t, w[f"{p}.{name}.weight"], w[f"{p}.{name}.bias"])

        h = F.layer_norm(x, (self.hidden,), w[f"{p}.layer_norm1.weight"], w[f"{p}.layer_norm1.bias"], self.eps)
        n, s, _ = h.shape
        q, k, v = (lin(f"self_attn.{name}", h).view(n, s, self.num_heads, -1).transpose(1, 2)
                   for name in ("q_proj", "k_proj", "v_proj"))
        attn = F.scaled_dot_product_attention(q, k, v)  # every patch sees every patch
        x = x + lin("self_attn.out_proj", attn.transpose(1, 2).reshape(n, s, self.hidden))
        h = F.layer_norm(x, (self.hidden,), w[f"{p}.layer_norm2.weight"], w[f"{p}.layer_norm2.bias"], self.eps)
        return x + lin("mlp.fc2", self.act(lin("mlp.fc1", h)))
