"""A tiny random Qwen2.5-VL checkpoint written by the tests (HF save_pretrained of the model and its processor,
a byte-level tokenizer with Qwen's chat and vision special tokens)."""

from __future__ import annotations

from pathlib import Path

import torch

# Qwen2.5-VL's chat template's shape (the image part as Qwen writes it), reading string or list content.
QWEN_VL_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for item in message['content'] %}{% if item['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
            "<|video_pad|>")


def qwen_vl_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for special in SPECIALS:
        vocab[special] = len(vocab)
    tk = Tokenizer(models.BPE(vocab, [], unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": list(SPECIALS[1:])})
    return tok


def make_tiny_qwen25vl(folder: Path, seed: int = 0, max_pixels: int = 48 * 48) -> Path:
    """Qwen2.5-VL in miniature: 4 px patches merged 2x2 (an 8 px cell per image token), images resized by the
    processor to multiples of 8 between 16x16 and max_pixels, a 4-layer vision tower (windows of 2x2 cells;
    layers 1 and 3 full attention), a 2-layer Qwen2 text model with M-RoPE sections [2, 3, 3]."""
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessorPil,
    )

    from wslm.backend.frontend.hf_processor import image_only

    tok = qwen_vl_tokenizer()
    ids = {s: tok.convert_tokens_to_ids(s) for s in SPECIALS}
    torch.manual_seed(seed)
    vision = dict(depth=4, hidden_size=32, intermediate_size=48, num_heads=4, patch_size=4, spatial_merge_size=2,
                  temporal_patch_size=2, window_size=16, out_hidden_size=64, fullatt_block_indexes=[1, 3],
                  hidden_act="silu", initializer_range=0.2)
    text = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=len(tok), max_position_embeddings=512, initializer_range=0.2,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    config = Qwen2_5_VLConfig(vision_config=vision, text_config=text, image_token_id=ids["<|image_pad|>"],
                              video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                              vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    image_processor = Qwen2VLImageProcessorPil(patch_size=4, merge_size=2, temporal_patch_size=2,
                                               min_pixels=16 * 16, max_pixels=max_pixels)
    # Without torchvision transformers cannot build the processor's video half: wslm's loader builds it without.
    processor = image_only(Qwen2_5_VLProcessor)(image_processor, tok, chat_template=QWEN_VL_TEMPLATE)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def hf_generate_top(folder: Path, messages: list[dict], images: list, steps: int, k: int = 5,
                    processor_kwargs: dict | None = None):
    """HF transformers' greedy `generate` (its KV cache and M-RoPE deltas carry the decode positions): the
    prompt ids and per step the top-k {token id: logprob}. processor_kwargs: the image processor's settings
    over the checkpoint's."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    from wslm.backend.frontend.hf_processor import load_processor

    proc = load_processor(folder, processor_kwargs)
    model = _hf_model(folder, Qwen2_5_VLForConditionalGeneration)
    text = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = proc(text=[text], images=images or None, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                             output_logits=True, return_dict_in_generate=True)
    tops = []
    for logits in out.logits:
        top = logits[0].float().log_softmax(-1).topk(k)
        tops.append(dict(zip(top.indices.tolist(), top.values.tolist())))
    return inputs.input_ids[0].tolist(), tops


_models: dict = {}


def _hf_model(folder: Path, cls):
    if folder not in _models:
        _models[folder] = cls.from_pretrained(folder, dtype=torch.float32).eval()
    return _models[folder]
