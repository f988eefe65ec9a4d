"""Greedy output must be token-identical to HF transformers' generate."""

import pytest
from engine_helpers import hf_greedy

from wslm.backend import LLM, SamplingParams

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one short sentence."},
     {"role": "user", "content": "Why is the sky blue?"}],
]  # fmt: skip


def test_demo_model_matches_hf(demo_llm, demo_hf_model):
    tok = demo_llm.get_tokenizer()
    engine = demo_llm.llm_engine
    prompts = [engine.apply_chat_template(c) for c in CHATS]
    outs = demo_llm.generate(
        [{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=20)
    )
    for prompt, out in zip(prompts, outs):
        expected = hf_greedy(demo_hf_model, tok, prompt, 20)
        assert out.outputs[0].token_ids == expected
        assert out.outputs[0].text == tok.decode(expected, skip_special_tokens=True)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_random_models_match_hf(tiny_models, arch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tiny_models[arch]
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    llm = LLM(str(folder), kv_cache_memory=16 << 20, block_size=16, dtype="float32")
    prompts = ["Hello there, how are you today?", "A", "The quick brown fox jumps over the lazy dog " * 3]
    ids = [tok.encode(p) for p in prompts]
    outs = llm.generate([{"prompt_token_ids": i} for i in ids], SamplingParams(temperature=0, max_tokens=24))
    for prompt_ids, out in zip(ids, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf, tok, prompt_ids, 24)


def test_unsupported_architecture_is_named(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*Supported: LlamaForCausalLM"):
        LLM(str(tmp_path))


def test_missing_model_says_how_to_get_it():
    with pytest.raises(FileNotFoundError, match="wslm models pull"):
        LLM("no-such-org/no-such-model")


def test_bfloat16_engine_answers_sensibly():
    import torch

    from wslm.backend.model_loader import cpu_has_amx_bf16, resolve_dtype

    llm = LLM("demo", dtype="bfloat16", kv_cache_memory=64 << 20, max_model_len=512)
    assert llm.llm_engine.model_config.dtype.is_floating_point
    assert str(llm.llm_engine.runner.kv_pool.dtype) == "torch.bfloat16"
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}], SamplingParams(temperature=0, max_tokens=12))
    assert "Paris" in out[0].outputs[0].text
    auto = "bfloat16" if cpu_has_amx_bf16() else "float32"
    assert str(resolve_dtype("auto", None, torch.device("cpu"))) == f"torch.{auto}"


def test_sliding_window_models_run_windowed_attention_over_the_whole_context(tmp_path):
    import json

    from engine_helpers import demo_tokenizer, make_tiny_model
    from transformers import AutoModelForCausalLM

    tok = demo_tokenizer()
    folder = make_tiny_model(tmp_path / "m", "llama", tok)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=16)
    cfg.pop("rope_scaling", None)
    cfg.pop("rope_parameters", None)
    (folder / "config.json").write_text(json.dumps(cfg))
    llm = LLM(str(folder), kv_cache_memory=16 << 20, dtype="float32")
    assert llm.llm_engine.max_model_len == 512  # no longer capped at the window
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = tok.encode("The quick brown fox jumps over the lazy dog " * 4)  # longer than the window
    out = llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=20))[0]
    assert out.outputs[0].token_ids == hf_greedy(hf, tok, ids, 20)
