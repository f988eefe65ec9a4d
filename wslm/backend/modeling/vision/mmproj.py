"""llama.cpp's `mmproj` GGUF (clip.cpp / mtmd format: general.architecture "clip", clip.vision.* keys, tensors
v.* for the vision tower and mm.* for the projector), as LM Studio and `llama-server --mmproj` load it beside a
text GGUF: its settings (read_mmproj), its tensors under the names our vision towers and projectors load
(mmproj_weights), and where LM Studio finds one (find_mmproj: an mmproj*.gguf beside the model file).

Projector types run here: "mlp" (LLaVA-1.5: CLIP + two-layer MLP) and "gemma3" (SigLIP + pooled projector).
The tower's depth, feature layer, activation and projector settings follow clip.cpp's reading of the keys
(tools/mtmd/clip.cpp, models/llava.cpp, models/siglip.cpp)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch and numpy only where tensors are read: model_source imports the file names part
    import torch

# projector type -> (what it is, the text architectures it pairs with -> the class that runs the pair)
SUPPORTED_PROJECTORS: dict[str, tuple[str, dict[str, str]]] = {
    "mlp": ("LLaVA-1.5 (CLIP + two-layer MLP)", {
        "LlamaForCausalLM": "LlavaForConditionalGeneration",
        "MistralForCausalLM": "LlavaForConditionalGeneration",
    }),
    "gemma3": ("Gemma 3 (SigLIP + pooled projector)", {
        "Gemma3ForCausalLM": "Gemma3ForConditionalGeneration",
        "Gemma3ForConditionalGeneration": "Gemma3ForConditionalGeneration",
    }),
    "idefics3": ("SmolVLM / Idefics3 (SigLIP + pixel-shuffle connector)", {
        "LlamaForCausalLM": "Idefics3ForConditionalGeneration",
    }),
}
MEDIA_MARKER = "<__media__>"  # where an image goes in a prompt's text (llama.cpp's mtmd_default_marker)
# Text around each image's embeddings, as mtmd writes it per projector type (mtmd.cpp init_vision).
IMAGE_TEXT = {"mlp": ("", ""), "gemma3": ("<start_of_image>", "<end_of_image>")}  # idefics3: tiles (row/col)
# Pad colour of the letterboxed image (clip.cpp: LLaVA's mean colour; black otherwise) and its resampling.
_PAD = {"mlp": (122, 116, 104), "gemma3": (0, 0, 0)}
_RESAMPLE = {"mlp": "BICUBIC", "gemma3": "BILINEAR"}


def supported_list() -> str:
    return ", ".join(f"{name!r} ({what})" for name, (what, _) in SUPPORTED_PROJECTORS.items())


def is_mmproj_name(name: str) -> bool:
    """LM Studio's and llama.cpp's naming: mmproj-*.gguf, mmproj-model-f16.gguf, ...mmproj*.gguf."""
    lower = name.lower()
    return lower.endswith(".gguf") and "mmproj" in lower


def find_mmproj(model_file: Path) -> Path | None:
    """An mmproj GGUF beside a model file (LM Studio's layout); the first by name when there are several."""
    if is_mmproj_name(model_file.name):
        return None
    found = sorted(p for p in model_file.parent.glob("*.gguf") if is_mmproj_name(p.name) and p.is_file())
    return found[0] if found else None


@dataclass(frozen=True, slots=True)
class MmprojInfo:
    path: str
    projector: str
    n_embd: int
    n_head: int
    n_ff: int
    n_layer: int
    eps: float
    image_size: int
    patch_size: int
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    projection_dim: int  # the text model's hidden size it feeds
    feature_layers: tuple[int, ...]  # hidden states read (0: the embeddings after the pre-LayerNorm)
    act: str
    scale_factor: int  # gemma3: the patch grid pooled by this per side; idefics3: the pixel shuffle's
    preproc_size: int  # idefics3: the longest edge an image is resized to before it is cut into tiles

    @property
    def layers_run(self) -> int:
        """Encoder layers run: up to the deepest feature layer (LLaVA), all of them (SigLIP)."""
        return max(self.feature_layers) if self.projector == "mlp" else self.n_layer

    @property
    def image_tokens(self) -> int:
        side = self.image_size // self.patch_size
        if self.projector in ("gemma3", "idefics3"):
            side //= self.scale_factor
        return side * side

    def vision_config(self) -> SimpleNamespace:
        """What our CLIP / SigLIP towers read from a transformers vision config."""
        return SimpleNamespace(hidden_size=self.n_embd, num_attention_heads=self.n_head,
                               num_hidden_layers=self.layers_run, patch_size=self.patch_size,
                               image_size=self.image_size, layer_norm_eps=self.eps, hidden_act=self.act)

    @property
    def pad_color(self) -> tuple[int, int, int]:
        return _PAD[self.projector]

    @property
    def resample(self) -> str:
        return _RESAMPLE[self.projector]


def read_mmproj(path: str | Path) -> MmprojInfo:
    """The projector file's settings; ValueError naming the cause and the fix (not an mmproj file, no vision
    encoder, a projector type wslm does not run)."""
    from wslm.backend.quant.gguf_file import GGUFFile

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No such mmproj file: {path}.")
    try:
        header = GGUFFile(path)
    except ValueError:
        raise ValueError(f"{path} is not a GGUF file; --mmproj takes llama.cpp's mmproj GGUF (the vision "
                         "projector that comes beside a vision model's GGUF, e.g. mmproj-model-f16.gguf).") from None
    try:
        get = header.values.get
        if get("general.architecture") != "clip":
            raise ValueError(f"{path.name} is not an mmproj file (general.architecture is "
                             f"{get('general.architecture')!r}, not 'clip'): pass the model's vision projector "
                             "GGUF to --mmproj, and the text model as the model.")
        if not get("clip.has_vision_encoder", True):
            raise ValueError(f"{path.name} has no vision encoder (an audio-only projector): wslm takes images only.")
        proj = str(get("clip.vision.projector_type") or get("clip.projector_type") or "")
        if proj not in SUPPORTED_PROJECTORS:
            raise ValueError(f"{path.name} has projector type {proj or '(none)'!r}, which wslm does not run yet; "
                             f"supported mmproj projector types: {supported_list()}.")
        names = {t.name for t in header.tensors}
        if proj == "mlp" and "mm.3.weight" in names:
            raise ValueError(f"{path.name} is a Yi-style LLaVA projector (mlp_norm), which wslm does not run yet; "
                             f"supported: {supported_list()}.")
        n_layer = int(get("clip.vision.block_count"))
        features = tuple(int(x) for x in (get("clip.vision.feature_layer") or []) if int(x) >= 0)
        if proj == "mlp" and not features:
            features = (n_layer - 1,)  # clip.cpp: the second to last layer's output
        if get("clip.use_gelu"):
            act = "gelu_pytorch_tanh"  # ggml_gelu, SigLIP's gelu_pytorch_tanh
        elif get("clip.use_silu"):
            act = "silu"
        else:
            act = "quick_gelu"  # CLIP's (LLaVA-1.5's)
        info = MmprojInfo(
            path=str(path), projector=proj, n_embd=int(get("clip.vision.embedding_length")),
            n_head=int(get("clip.vision.attention.head_count")), n_ff=int(get("clip.vision.feed_forward_length")),
            n_layer=n_layer, eps=float(get("clip.vision.attention.layer_norm_epsilon") or 1e-6),
            image_size=int(get("clip.vision.image_size")), patch_size=int(get("clip.vision.patch_size")),
            image_mean=tuple(float(x) for x in get("clip.vision.image_mean")),
            image_std=tuple(float(x) for x in get("clip.vision.image_std")),
            projection_dim=int(get("clip.vision.projection_dim") or 0), feature_layers=features or (n_layer,),
            act=act, scale_factor=int(get("clip.vision.projector.scale_factor") or (2 if proj == "idefics3" else 4)),
            preproc_size=int(get("clip.vision.preproc_image_size") or get("clip.vision.image_size")))
    except (TypeError, KeyError) as exc:
        raise ValueError(f"{path.name} lacks a setting clip.cpp needs ({exc}): is the file complete?") from None
    finally:
        header.close()
    return info


def check_pair(info: MmprojInfo, text_arch: str, text_hidden: int, model_name: str) -> str:
    """The architecture that runs the text model with this projector; ValueError when they do not belong
    together (llama.cpp: "mismatch between text model and mmproj")."""
    what, pairs = SUPPORTED_PROJECTORS[info.projector]
    name = Path(info.path).name
    if text_arch not in pairs:
        raise ValueError(f"{name} is a {info.projector!r} projector ({what}), which goes with "
                         f"{' / '.join(sorted(pairs))} models, not {model_name} ({text_arch}): pass the mmproj file "
                         "that came with this model.")
    out_dim = _projector_out_dim(info)
    if out_dim != text_hidden:
        raise ValueError(f"{name} makes {out_dim}-wide image embeddings but {model_name} has hidden size "
                         f"{text_hidden}: the mmproj belongs to another model; pass the one that came with it.")
    return pairs[text_arch]


def _projector_out_dim(info: MmprojInfo) -> int:
    from wslm.backend.quant.gguf_file import GGUFFile

    header = GGUFFile(info.path)
    try:
        shapes = {t.name: tuple(int(d) for d in reversed(t.shape)) for t in header.tensors}
    finally:
        header.close()
    if info.projector == "mlp":
        last = shapes.get("mm.2.weight") or shapes.get("mm.0.weight")
        return last[0] if last else info.projection_dim
    if info.projector == "idefics3":
        fc = shapes.get("mm.model.fc.weight")
        return fc[0] if fc else info.projection_dim
    proj = shapes.get("mm.input_projection.weight")
    return proj[1] if proj else info.projection_dim


# Our tower's names for clip.cpp's per-layer tensors.
_LAYER = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_out": "self_attn.out_proj", "ln1": "layer_norm1", "ln2": "layer_norm2", "ffn_up": "mlp.fc1",
          "ffn_down": "mlp.fc2"}
_TOP = {"v.class_embd": "embeddings.class_embedding", "v.patch_embd.weight": "embeddings.patch_embedding.weight",
        "v.patch_embd.bias": "embeddings.patch_embedding.bias",
        "v.position_embd.weight": "embeddings.position_embedding.weight",
        "v.pre_ln.weight": "pre_layrnorm.weight", "v.pre_ln.bias": "pre_layrnorm.bias",
        "v.post_ln.weight": "post_layernorm.weight", "v.post_ln.bias": "post_layernorm.bias"}
_PROJECTOR = {"mm.0.weight": "linear_1.weight", "mm.0.bias": "linear_1.bias", "mm.2.weight": "linear_2.weight",
              "mm.2.bias": "linear_2.bias", "mm.input_projection.weight": "mm_input_projection_weight",
              "mm.soft_emb_norm.weight": "mm_soft_emb_norm.weight"}
_CONNECTOR = {"mm.model.fc.weight": "model.connector.modality_projection.proj.weight"}  # idefics3


def mmproj_weights(info: MmprojInfo) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, float32 tensor) for the tower ("vision_tower.<transformers name>") and the projector
    ("multi_modal_projector.<name>"), as the HF checkpoint names them. Layers past those run are skipped.
    Legacy files with ffn_up / ffn_down swapped are put right as clip.cpp does (by the down matrix's shape)."""
    from wslm.backend.quant.gguf_file import GGUFFile

    header = GGUFFile(info.path)
    try:
        for t in header.tensors:
            name = t.name
            m = re.fullmatch(r"v\.blk\.(\d+)\.(\w+)\.(weight|bias)", name)
            if m:
                layer, part, kind = int(m.group(1)), m.group(2), m.group(3)
                if layer >= info.layers_run or part not in _LAYER:
                    continue
                if part in ("ffn_up", "ffn_down") and _ffn_swapped(header, layer, info.n_embd):
                    part = "ffn_down" if part == "ffn_up" else "ffn_up"
                yield f"vision_tower.encoder.layers.{layer}.{_LAYER[part]}.{kind}", _tensor(t)
            elif name in _TOP:
                yield f"vision_tower.{_TOP[name]}", _tensor(t)
            elif name in _CONNECTOR:
                yield _CONNECTOR[name], _tensor(t)
            elif name in _PROJECTOR:
                tensor = _tensor(t)
                if name == "mm.soft_emb_norm.weight":
                    tensor = tensor - 1  # llama.cpp's converter stores Gemma's (1 + w); our projector adds the 1
                yield f"multi_modal_projector.{_PROJECTOR[name]}", tensor
    finally:
        header.close()


def with_projector(weights, info: MmprojInfo | None):
    """A model's checkpoint weights followed by its mmproj file's (info None: the weights alone)."""
    if info is None:
        return weights
    from itertools import chain

    return chain(weights, mmproj_weights(info))


def _ffn_swapped(header, layer: int, n_embd: int) -> bool:
    down = next((t for t in header.tensors if t.name == f"v.blk.{layer}.ffn_down.weight"), None)
    return down is not None and int(down.shape[0]) == n_embd  # its input is the tower's width: really the up


def _tensor(t) -> torch.Tensor:
    import numpy as np
    import torch

    shape = tuple(int(d) for d in reversed(t.shape))
    data = t.data
    if data.dtype not in (np.float32, np.float16):
        from gguf.quants import dequantize

        data = dequantize(np.asarray(data), t.tensor_type)
    return torch.from_numpy(np.array(data, dtype=np.float32)).reshape(shape)
