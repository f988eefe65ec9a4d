"""Tiny random vision-language checkpoints written by the tests (HF save_pretrained of the model and its
processor, a byte-level tokenizer of 259 tokens), images as bytes, and HF transformers' own answers."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import torch

# The LLaVA-1.5 chat template's shape (llava-hf's), reading string or list content.
LLAVA_TEMPLATE = (
    "{% for message in messages %}{{ message['role'].upper() }}: {% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for item in message['content'] %}{% if item['type'] == 'image' %}"
    "<image>\n{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


def tiny_tokenizer():
    """Byte-level BPE with no merges: every text round-trips; <s>, </s> and <image> are special."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for special in ("<s>", "</s>", "<image>"):
        vocab[special] = len(vocab)
    tk = Tokenizer(models.BPE(vocab, [], unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="</s>")
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    return tok


def make_tiny_llava(folder: Path, seed: int = 0) -> Path:
    """LLaVA-1.5 in miniature: CLIP tower (28 px images, 7 px patches: 16 image tokens, 3 layers, the
    second to last read), GELU projector, 2-layer Llama with GQA."""
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tok = tiny_tokenizer()
    torch.manual_seed(seed)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                              image_size=28, patch_size=7, projection_dim=32)
    text = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=len(tok), max_position_embeddings=512,
                       tie_word_embeddings=False, initializer_range=0.2, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_id=tok.convert_tokens_to_ids("<image>"),
                         vision_feature_layer=-2, vision_feature_select_strategy="default")
    model = LlavaForConditionalGeneration(config).eval()
    image_processor = CLIPImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tok, patch_size=7,
                               vision_feature_select_strategy="default", chat_template=LLAVA_TEMPLATE,
                               num_additional_image_tokens=1)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def noise_image(width: int, height: int, seed: int):
    from PIL import Image

    return Image.fromarray((np.random.RandomState(seed).rand(height, width, 3) * 255).astype("uint8"))


def image_bytes(img, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def hf_greedy_top(folder: Path, messages: list[dict], images: list, steps: int, k: int = 5):
    """HF transformers' greedy continuation of a chat with images: per step the top-k {token id: logprob}."""
    import transformers
    from transformers import AutoConfig, AutoProcessor

    proc = AutoProcessor.from_pretrained(folder)
    model_cls = getattr(transformers, AutoConfig.from_pretrained(folder).architectures[0])
    model = model_cls.from_pretrained(folder, dtype=torch.float32).eval()
    text = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = proc(text=text, images=images or None, return_tensors="pt", add_special_tokens=False)
    ids = inputs.input_ids
    types = inputs.get("token_type_ids")  # Gemma 3: marks image tokens (bidirectional within an image)
    out = []
    with torch.no_grad():
        for _ in range(steps):
            extra = {} if types is None else {"token_type_ids": types}
            logits = model(input_ids=ids, pixel_values=inputs.get("pixel_values"), **extra).logits[0, -1]
            top = logits.float().log_softmax(-1).topk(k)
            out.append(dict(zip(top.indices.tolist(), top.values.tolist())))
            ids = torch.cat([ids, top.indices[:1].view(1, 1)], dim=1)
            if types is not None:
                types = torch.cat([types, torch.zeros_like(types[:, :1])], dim=1)
    return inputs.input_ids[0].tolist(), out


GEMMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<start_of_image>{% elif item['type'] == 'text' %}{{ item['text'] }}"
    "{% endif %}{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def gemma3_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    specials = ("<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
                "<end_of_image>", "<image_soft_token>")
    for special in specials:
        vocab[special] = len(vocab)
    tk = Tokenizer(models.BPE(vocab, [], unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
        extra_special_tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                              "image_token": "<image_soft_token>"})
    tok.add_special_tokens({"additional_special_tokens": list(specials[3:])})
    return tok


def make_tiny_gemma3(folder: Path, seed: int = 0, text_layers: int = 2) -> Path:
    """Gemma 3 with its SigLIP tower in miniature: 28 px images, 7 px patches (a 4x4 grid pooled to 2x2: 4
    image tokens), 2 text layers (one sliding, window 8, shorter than a prompt); text_layers=6: Gemma 3's own
    pattern (every 6th layer global) and query scale, as a GGUF of it reads back."""
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessorPil,
        Gemma3Processor,
        Gemma3TextConfig,
        SiglipVisionConfig,
    )

    tok = gemma3_tokenizer()
    torch.manual_seed(seed)
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                image_size=28, patch_size=7, vision_use_head=False)
    text = Gemma3TextConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=16, vocab_size=len(tok), max_position_embeddings=512,
                            sliding_window=8, num_hidden_layers=text_layers,
                            layer_types=["sliding_attention"] * (text_layers - 1) + ["full_attention"],
                            # 6 layers: as GGUF-shaped as the real models (query scale 1/sqrt(head_dim))
                            query_pre_attn_scalar=16 if text_layers == 6 else 256,
                            initializer_range=0.2, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                            pad_token_id=tok.pad_token_id)
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                          boi_token_index=tok.convert_tokens_to_ids("<start_of_image>"),
                          eoi_token_index=tok.convert_tokens_to_ids("<end_of_image>"),
                          image_token_index=tok.convert_tokens_to_ids("<image_soft_token>"))
    model = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # the projector's matrix starts at zeros: make images matter
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0.0, 0.5)
        model.model.multi_modal_projector.mm_soft_emb_norm.weight.normal_(0.0, 0.5)
    image_processor = Gemma3ImageProcessorPil(size={"height": 28, "width": 28})
    processor = Gemma3Processor(image_processor=image_processor, tokenizer=tok, chat_template=GEMMA3_TEMPLATE,
                                image_seq_length=4)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


SMOLVLM_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}:{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for item in message['content'] %}{% if item['type'] == 'image' %}<image>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)


def make_tiny_smolvlm(folder: Path, seed: int = 0) -> Path:
    """SmolVLM (Idefics3) in miniature: 28 px tiles of 7 px patches, pixel shuffle by 2 (4 tokens a tile), an
    image cut into up to 2x2 tiles of a 56 px resize plus the 28 px global image; 2-layer Llama."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3Processor,
        Idefics3VisionConfig,
        LlamaConfig,
        PreTrainedTokenizerFast,
    )

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    specials = ["<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>", "<global-img>"]
    specials += [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)]
    for special in specials:
        vocab[special] = len(vocab)
    tk = Tokenizer(models.BPE(vocab, [], unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|im_start|>", eos_token="<end_of_utterance>",
                                  pad_token="<end_of_utterance>")
    tok.add_special_tokens({"additional_special_tokens": specials})
    torch.manual_seed(seed)
    vision = Idefics3VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  image_size=28, patch_size=7)
    text = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=len(tok), max_position_embeddings=512,
                       tie_word_embeddings=False, initializer_range=0.2, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config = Idefics3Config(vision_config=vision, text_config=text, scale_factor=2,
                            image_token_id=tok.convert_tokens_to_ids("<image>"), tie_word_embeddings=False)
    model = Idefics3ForConditionalGeneration(config).eval()
    image_processor = Idefics3ImageProcessorPil(size={"longest_edge": 56}, max_image_size={"longest_edge": 28},
                                                do_image_splitting=True)
    processor = Idefics3Processor(image_processor=image_processor, tokenizer=tok, image_seq_len=4,
                                  chat_template=SMOLVLM_TEMPLATE)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def check_top(out, expected_ids, expected_top, steps: int) -> None:
    """wslm's RequestOutput against hf_greedy_top's (prompt ids, per-step top-k): the same prompt ids, greedy
    tokens, and every HF top-k logprob within 2e-4."""
    import pytest

    assert list(out.prompt_token_ids) == expected_ids
    got = out.outputs[0]
    assert got.token_ids[:steps] == [next(iter(step)) for step in expected_top]
    for ours, theirs in zip(got.logprobs, expected_top):
        for token, logprob in theirs.items():
            assert ours[token].logprob == pytest.approx(logprob, abs=2e-4)
