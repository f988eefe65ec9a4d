"""A tiny HF vision checkpoint (vision_helpers.py) split as llama.cpp ships it: the text model as a GGUF and the
vision tower + projector as an mmproj GGUF, written with gguf's writer under llama.cpp's names and keys (the
legacy LLaVA converter's for "mlp": its swapped ffn names and a tower cut at the feature layer; the current
converter's for "gemma3" and "idefics3")."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from gguf_writer import write_gguf

# transformers' vision tower names -> llama.cpp's (the current converter: fc1 is ffn_up)
_TOWER = (("encoder.layers", "blk"), ("embeddings.class_embedding", "class_embd"),
          ("embeddings.patch_embedding", "patch_embd"), ("embeddings.position_embedding", "position_embd"),
          ("pre_layrnorm", "pre_ln"), ("post_layernorm", "post_ln"), ("self_attn.q_proj", "attn_q"),
          ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"), ("self_attn.out_proj", "attn_out"),
          ("layer_norm1", "ln1"), ("layer_norm2", "ln2"), ("mlp.fc1", "ffn_up"), ("mlp.fc2", "ffn_down"))


def llava_pair_files(root: Path) -> tuple[Path, Path, Path, Path]:
    """(HF folder, text GGUF, mmproj GGUF, tokenizer folder with the LLaVA template) under root."""
    from vision_helpers import LLAVA_TEMPLATE, make_tiny_llava, tiny_tokenizer

    folder = make_tiny_llava(root / "hf")
    model, mmproj = write_llava_pair(folder, root / "gguf")
    tok = tiny_tokenizer()
    tok.chat_template = LLAVA_TEMPLATE
    tok.save_pretrained(root / "tok")
    return folder, model, mmproj, root / "tok"


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's converter's q/k row order for Llama (LlamaModel.permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _llama_gguf(path: Path, body, lm_head, text_config) -> Path:
    """A Llama text model (its body and head taken from a vision checkpoint) as llama.cpp's converter writes it."""
    from transformers import LlamaForCausalLM

    text = LlamaForCausalLM(text_config)
    text.model.load_state_dict(body.state_dict())
    text.lm_head.load_state_dict(lm_head.state_dict())
    tensors = []
    for name, t in text.state_dict().items():
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = text_config.num_attention_heads if "q_proj" in name else text_config.num_key_value_heads
            t = _permute(t, heads)
        tensors.append((name, t))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_gguf(path, text, "llama", tensors=tensors)
    return path


def write_llava_pair(folder: Path, out: Path, projector_type: str = "mlp") -> tuple[Path, Path]:
    """(text GGUF, mmproj GGUF) from a tiny LLaVA-1.5 folder (make_tiny_llava)."""
    import gguf
    from transformers import LlavaForConditionalGeneration

    vl = LlavaForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    cfg = vl.config
    model_path = _llama_gguf(out / "tiny-llava-F32.gguf", vl.model.language_model, vl.lm_head, cfg.text_config)
    vc = cfg.vision_config
    layer = cfg.vision_feature_layer % (vc.num_hidden_layers + 1)  # -2 -> 2 of 3: the legacy converter's key
    w = gguf.GGUFWriter(str(out / "mmproj-tiny-llava-f32.gguf"), "clip")
    w.add_bool("clip.has_text_encoder", False)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_llava_projector", True)
    w.add_string("clip.projector_type", projector_type)
    w.add_uint32("clip.vision.image_size", vc.image_size)
    w.add_uint32("clip.vision.patch_size", vc.patch_size)
    w.add_uint32("clip.vision.embedding_length", vc.hidden_size)
    w.add_uint32("clip.vision.feed_forward_length", vc.intermediate_size)
    w.add_uint32("clip.vision.projection_dim", vc.projection_dim)
    w.add_uint32("clip.vision.attention.head_count", vc.num_attention_heads)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", vc.layer_norm_eps)
    w.add_uint32("clip.vision.block_count", layer)
    w.add_array("clip.vision.feature_layer", [layer])
    w.add_array("clip.vision.image_mean", [0.48145466, 0.4578275, 0.40821073])
    w.add_array("clip.vision.image_std", [0.26862954, 0.26130258, 0.27577711])
    w.add_bool("clip.use_gelu", vc.hidden_act == "gelu")
    for name, t in vl.state_dict().items():
        if name.startswith("model.multi_modal_projector."):
            new = name.replace("model.multi_modal_projector.", "mm.").replace("linear_1", "0").replace("linear_2", "2")
        elif name.startswith("model.vision_tower.") and "post_layernorm" not in name:
            new = _tower_name(name)
            if new.startswith("v.blk.") and int(new.split(".")[2]) >= layer:
                continue  # the converter cuts the tower at the feature layer
            # the legacy converter named fc1 ffn_down and fc2 ffn_up (clip.cpp swaps them back by shape)
            new = new.replace("ffn_up", "ffn_tmp").replace("ffn_down", "ffn_up").replace("ffn_tmp", "ffn_down")
        else:
            continue
        w.add_tensor(new, t.float().numpy())
    _close(w)
    return model_path, out / "mmproj-tiny-llava-f32.gguf"


def _tower_name(name: str) -> str:
    new = name.replace("model.vision_tower.vision_model.", "v.").replace("model.vision_tower.", "v.")
    new = new.replace("model.vision_model.", "v.")
    for old, repl in _TOWER:
        new = new.replace(old, repl)
    return new


def _current_mmproj(path: Path, folder: Path, cfg, projector_type) -> object:
    """A writer with the keys the current converter (MmprojModel) writes for every projector."""
    import gguf

    vc = cfg.vision_config
    processor = json.loads((folder / "processor_config.json").read_text())
    image = processor.get("image_processor", processor)
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_type(gguf.GGUFType.MMPROJ)
    w.add_clip_has_vision_encoder(True)
    w.add_vision_projection_dim(cfg.text_config.hidden_size)
    w.add_vision_image_size(vc.image_size)
    w.add_vision_patch_size(vc.patch_size)
    w.add_vision_embedding_length(vc.hidden_size)
    w.add_vision_feed_forward_length(vc.intermediate_size)
    w.add_vision_block_count(vc.num_hidden_layers)
    w.add_vision_head_count(vc.num_attention_heads)
    w.add_vision_image_mean(image["image_mean"])
    w.add_vision_image_std(image["image_std"])
    w.add_clip_projector_type(projector_type)
    w.add_vision_attention_layernorm_eps(vc.layer_norm_eps)
    w.add_vision_use_gelu(True)
    return w, image


def write_gemma3_pair(folder: Path, out: Path) -> tuple[Path, Path]:
    """(text GGUF, mmproj GGUF) from a tiny Gemma 3 folder (make_tiny_gemma3), named as the current converter
    (Gemma3VisionModel) writes them: the soft-embedding norm stored as 1 + w, the pooling factor in
    clip.vision.projector.scale_factor (4 patches per side pooled to 2)."""
    import gguf
    from transformers import Gemma3ForCausalLM, Gemma3ForConditionalGeneration

    vl = Gemma3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    cfg = vl.config
    text = Gemma3ForCausalLM(cfg.text_config)
    text.model.load_state_dict(vl.model.language_model.state_dict())
    out.mkdir(parents=True, exist_ok=True)
    model_path = out / "tiny-gemma3-F32.gguf"
    write_gguf(model_path, text, "gemma3")
    mmproj = out / "mmproj-tiny-gemma3-f32.gguf"
    w, _ = _current_mmproj(mmproj, folder, cfg, gguf.VisionProjectorType.GEMMA3)
    side = cfg.vision_config.image_size // cfg.vision_config.patch_size
    w.add_vision_projector_scale_factor(side // int(cfg.mm_tokens_per_image**0.5))
    for name, t in vl.state_dict().items():
        if name.endswith("mm_input_projection_weight"):
            new = "mm.input_projection.weight"
        elif name.endswith("mm_soft_emb_norm.weight"):
            new, t = "mm.soft_emb_norm.weight", t + 1
        elif name.startswith("model.vision_tower."):
            new = _tower_name(name)
        else:
            continue
        w.add_tensor(new, t.float().numpy())
    _close(w)
    return model_path, mmproj


def write_smolvlm_pair(folder: Path, out: Path) -> tuple[Path, Path]:
    """(text GGUF, mmproj GGUF) from a tiny SmolVLM folder (make_tiny_smolvlm), named and keyed as llama.cpp's
    SmolVLMModel converter writes them (projector type idefics3, scale factor, preproc image size, the
    connector as mm.model.fc)."""
    import gguf
    from transformers import Idefics3ForConditionalGeneration

    vl = Idefics3ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    cfg = vl.config
    model_path = _llama_gguf(out / "tiny-smolvlm-F32.gguf", vl.model.text_model, vl.lm_head, cfg.text_config)
    mmproj = out / "mmproj-tiny-smolvlm-f32.gguf"
    w, image = _current_mmproj(mmproj, folder, cfg, gguf.VisionProjectorType.IDEFICS3)
    w.add_vision_projector_scale_factor(cfg.scale_factor)
    w.add_vision_preproc_image_size(image["size"]["longest_edge"])
    for name, t in vl.state_dict().items():
        if name.startswith("model.connector."):
            new = "mm.model.fc.weight"
        elif name.startswith("model.vision_model."):
            new = _tower_name(name)
        else:
            continue
        w.add_tensor(new, t.float().numpy())
    _close(w)
    return model_path, mmproj


def retyped_mmproj(src: Path, dst: Path, projector_type: str) -> Path:
    """src with clip.projector_type set to projector_type (a type wslm does not run, for the refusals)."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), "clip")
    for key, field in reader.fields.items():
        if key.startswith("clip.") and key != "clip.projector_type":
            sub = field.types[1] if len(field.types) > 1 else None
            w.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    w.add_string("clip.projector_type", projector_type)
    for t in reader.tensors:
        w.add_tensor(t.name, t.data)
    _close(w)
    return dst


def _close(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
