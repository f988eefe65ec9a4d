"""Each model family, as a tiny random-weight checkpoint made here from its HF config class: greedy output
token-identical to HF transformers' generate (float32) alone, inside a batch of mixed-length prompts, on a
prefix-cache hit, and with preemption and chunked prefill forced by a tiny KV pool."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import hf_greedy
from gguf_writer import write_gguf

from wslm.backend import LLM, SamplingParams

MAX_TOKENS = 16
TEXTS = [
    "Hi",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a village by the sea, there lived an old clockmaker who fixed every clock "
    "in town except his own",
]  # fmt: skip


@pytest.fixture
def tok(demo_tok):
    return demo_tok


def _randomize_norms(model, std: float) -> None:
    # HF initializes norm weights to ones (Gemma: zeros, i.e. 1 + 0): random ones make a wrong norm show.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * std)


def phi3_config(common: dict, **extra):
    """A tiny Phi-3: partial rotary (half of each 16-dim head) with longrope factors."""
    import transformers as tf

    return tf.Phi3Config(
        hidden_size=80, num_hidden_layers=2, num_attention_heads=5, num_key_value_heads=1,
        original_max_position_embeddings=64, partial_rotary_factor=0.5, tie_word_embeddings=False,
        rope_scaling={"type": "longrope", "short_factor": [1.0, 1.3, 2.0, 3.5], "long_factor": [2.0, 3.0, 5.0, 7.0]},
        **extra, **common,
    )  # fmt: skip


def make_family_model(folder, family: str, tok, seed: int = 0):
    """A 2-4 layer model of `family` with GQA and an odd number of heads, saved with the demo tokenizer."""
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(
        vocab_size=len(tok), intermediate_size=96, max_position_embeddings=512, initializer_range=0.2,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, pad_token_id=tok.eos_token_id,
    )  # fmt: skip
    if family == "qwen3":
        config = tf.Qwen3Config(
            hidden_size=48, num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1, head_dim=16,
            tie_word_embeddings=False, **common,
        )  # fmt: skip
        model = tf.Qwen3ForCausalLM(config)
    elif family == "phi3":
        # Partial rotary (half of each 16-dim head) with longrope factors; prompts stay inside the
        # original 64 positions, where HF and wslm both use the short factors.
        config = phi3_config(common)
        model = tf.Phi3ForCausalLM(config)
    elif family == "gemma2":
        config = tf.Gemma2Config(
            hidden_size=48, num_hidden_layers=4, num_attention_heads=3, num_key_value_heads=1, head_dim=16,
            query_pre_attn_scalar=24, sliding_window=16, attn_logit_softcapping=8.0, final_logit_softcapping=12.0,
            **common,
        )  # fmt: skip
        model = tf.Gemma2ForCausalLM(config)
    elif family == "gemma3":
        config = tf.Gemma3TextConfig(
            hidden_size=48, num_hidden_layers=4, num_attention_heads=3, num_key_value_heads=1, head_dim=16,
            query_pre_attn_scalar=24, sliding_window=16,
            layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
            },
            **common,
        )  # fmt: skip
        model = tf.Gemma3ForCausalLM(config)
    elif family == "gpt_oss":
        # Sinks, a 16-token window on every other layer, YaRN, 8 experts top-2 with biases.
        config = tf.GptOssConfig(
            **{**common, "intermediate_size": 32}, hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
            num_key_value_heads=1, head_dim=16, num_local_experts=8, num_experts_per_tok=2, sliding_window=16,
            rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                             "truncate": False, "original_max_position_embeddings": 64, "rope_theta": 150000.0},
        )  # fmt: skip
        model = tf.GptOssForCausalLM(config)
    else:
        raise ValueError(family)
    _randomize_norms(model, 0.3)
    model.eval()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, model


def _tokens(llm, prompts: list[list[int]]) -> list[list[int]]:
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    )
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("family", ["qwen3", "phi3", "gemma2", "gemma3", "gpt_oss"])
def test_family_matches_hf_alone_batched_cached_and_preempted(family, tok, tmp_path):
    folder, hf = make_family_model(tmp_path / family, family, tok)
    prompts = [tok.encode(t) for t in TEXTS]
    longer = prompts[-1] + tok.encode(", nor the one on the church tower")  # starts with the long prompt
    assert len(prompts[-1]) > 16 + 8  # past Gemma's 16-token window, over several 8-token blocks
    expected = [hf_greedy(hf, tok, p, MAX_TOKENS) for p in [*prompts, longer]]

    llm = LLM(str(folder), kv_cache_memory=16 << 20, block_size=8, dtype="float32")
    assert _tokens(llm, [prompts[-1]]) == [expected[-2]]  # alone, nothing cached yet
    assert _tokens(llm, prompts) == expected[:-1]  # inside a batch of mixed lengths
    hit = llm.generate({"prompt_token_ids": longer}, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))[0]
    assert hit.num_cached_tokens >= 16  # the long prompt's full blocks came from the prefix cache
    assert hit.outputs[0].token_ids == expected[-1]

    # 10 blocks of 8 tokens cannot hold these four sequences at once (~150 tokens): preemption must
    # happen, and a 32-token budget sends prompts through in chunks.
    tight = LLM(str(folder), num_gpu_blocks_override=10, block_size=8, max_num_batched_tokens=32,
                max_model_len=80, dtype="float32")  # fmt: skip
    assert _tokens(tight, [*prompts, longer]) == expected
    engine = tight.llm_engine
    assert engine.scheduler.num_preemptions > 0
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_qwen3_gguf_written_here_loads_to_the_same_tokens(tok, tmp_path, monkeypatch):
    import transformers as tf

    monkeypatch.setenv("WSLM_GGUF_CACHE", "0")  # read this file itself, not a converted copy
    torch.manual_seed(1)
    # head_dim 128: transformers' GGUF config reader has no key for it and takes Qwen3's default.
    config = tf.Qwen3Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=3,
        num_key_value_heads=1, head_dim=128, max_position_embeddings=512, initializer_range=0.2,
        tie_word_embeddings=False, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
    )  # fmt: skip
    model = tf.Qwen3ForCausalLM(config).eval()
    _randomize_norms(model, 0.3)
    path = tmp_path / "tiny-qwen3-F32.gguf"
    write_gguf(path, model, "qwen3")
    prompts = [tok.encode(t) for t in TEXTS]
    expected = [hf_greedy(model, tok, p, MAX_TOKENS) for p in prompts]
    # The tokenizer comes from a folder (reading one from a GGUF: tests/test_models_gguf.py).
    tok.save_pretrained(tmp_path / "tok")
    llm = LLM(str(path), tokenizer=str(tmp_path / "tok"), kv_cache_memory=16 << 20, dtype="float32")
    assert llm.llm_engine.model_config.architecture == "Qwen3ForCausalLM"
    assert _tokens(llm, prompts) == expected


@pytest.mark.parametrize("family", ["phi3", "gemma2", "gemma3"])
def test_phi3_and_gemma_ggufs_written_here_load_to_the_same_tokens(family, tok, tmp_path, monkeypatch):
    """Shaped like the real models where transformers' GGUF config reader would fall back to defaults
    (wslm reads these from the file: gguf_config.py): Phi-4-mini's partial rotary with longrope and a
    window, Gemma's query_pre_attn_scalar = head_dim and Gemma 2's own softcaps, Gemma 3's linear rope
    scaling on its global layers (every 6th)."""
    import transformers as tf

    monkeypatch.setenv("WSLM_GGUF_CACHE", "0")
    torch.manual_seed(2)
    common = dict(
        vocab_size=len(tok), intermediate_size=96, max_position_embeddings=512, initializer_range=0.2,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
    )  # fmt: skip
    gemma = dict(hidden_size=48, num_attention_heads=3, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
                 sliding_window=16)  # fmt: skip
    if family == "phi3":
        config = phi3_config(common, sliding_window=24)
        model = tf.Phi3ForCausalLM(config)
    elif family == "gemma2":
        config = tf.Gemma2Config(num_hidden_layers=2, attn_logit_softcapping=8.0, final_logit_softcapping=12.0,
                                 **gemma, **common)  # fmt: skip
        model = tf.Gemma2ForCausalLM(config)
    else:
        config = tf.Gemma3TextConfig(
            num_hidden_layers=6, **gemma, **common,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
            },
        )  # fmt: skip
        model = tf.Gemma3ForCausalLM(config)
    _randomize_norms(model, 0.3)
    model.eval()
    path = tmp_path / f"tiny-{family}-F32.gguf"
    write_gguf(path, model, family)
    prompts = [tok.encode(t) for t in TEXTS]
    expected = [hf_greedy(model, tok, p, MAX_TOKENS) for p in prompts]
    tok.save_pretrained(tmp_path / "tok")
    llm = LLM(str(path), tokenizer=str(tmp_path / "tok"), kv_cache_memory=16 << 20, dtype="float32")
    assert llm.llm_engine.model_config.architecture == type(model).__name__
    assert _tokens(llm, prompts) == expected


def test_gemma3_multimodal_checkpoint_runs_its_text_tower(tok, tmp_path):
    """Gemma3ForConditionalGeneration (what google/gemma-3-4b-it and up ship): the language model's
    weights under language_model.*, the vision tower's skipped."""
    import json

    import transformers as tf
    from safetensors.torch import load_file, save_file

    folder, hf = make_family_model(tmp_path / "g3", "gemma3", tok)
    state = load_file(str(folder / "model.safetensors"))
    renamed = {"language_model." + k: v for k, v in state.items()}  # model.* -> language_model.model.*
    renamed["vision_tower.vision_model.post_layernorm.weight"] = torch.ones(8)
    (folder / "model.safetensors").unlink()
    save_file(renamed, str(folder / "model.safetensors"))
    text = json.loads((folder / "config.json").read_text())
    config = tf.Gemma3Config(text_config=text, vision_config={"hidden_size": 8, "num_hidden_layers": 1})
    config.architectures = ["Gemma3ForConditionalGeneration"]
    config.save_pretrained(folder)

    prompts = [tok.encode(t) for t in TEXTS]
    expected = [hf_greedy(hf, tok, p, MAX_TOKENS) for p in prompts]
    llm = LLM(str(folder), kv_cache_memory=16 << 20, dtype="float32")
    assert llm.llm_engine.model_config.architecture == "Gemma3ForConditionalGeneration"
    assert _tokens(llm, prompts) == expected


def test_models_list_marks_the_families_supported_and_names_them_for_others(tok, tmp_path):
    import json
    import shutil

    from safetensors.torch import save_file

    from wslm.backend.hub.catalog import list_models

    archs = ["Qwen3ForCausalLM", "Phi3ForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM",
             "Gemma3ForConditionalGeneration", "MistralForCausalLM", "GptOssForCausalLM", "GPTNeoXForCausalLM"]  # fmt: skip
    root = tmp_path / "models"
    tok.save_pretrained(tmp_path / "tok")
    for arch in archs:
        folder = root / arch
        folder.mkdir(parents=True)
        config = {
            "architectures": [arch],
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
        }
        weights = {"w": torch.zeros(2)}
        if arch == "GptOssForCausalLM":  # as released: MXFP4 experts, which load dequantized
            config["quantization_config"] = {"quant_method": "mxfp4"}
            weights["e.down_proj_blocks"] = torch.zeros(2, 4, 1, 16, dtype=torch.uint8)  # 2 values a byte
            weights["e.down_proj_scales"] = torch.zeros(2, 4, 1, dtype=torch.uint8)
        (folder / "config.json").write_text(json.dumps(config))
        save_file(weights, str(folder / "model.safetensors"))
        for f in (tmp_path / "tok").iterdir():
            shutil.copy(f, folder / f.name)
    listed = {m.id: m for m in list_models(cache_dir=tmp_path / "empty-cache", models_root=root)}
    for arch in archs[:-1]:
        assert listed[arch].supported, listed[arch].unsupported_reason
    oss = listed["GptOssForCausalLM"]  # estimated as it runs: 258 parameters at 16 (or 32) bits, not the file
    assert oss.num_params == 2 + 2 * 128 and oss.weights_memory_bytes >= 2 * oss.num_params
    other = listed["GPTNeoXForCausalLM"]
    assert not other.supported and "Qwen3ForCausalLM" in other.unsupported_reason
    assert "Gemma3ForCausalLM" in other.unsupported_reason
