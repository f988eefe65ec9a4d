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

    from wslm.backend.loader.model_loader import cpu_has_amx_bf16, resolve_dtype

    llm = LLM("demo", dtype="bfloat16", kv_cache_memory=64 << 20, max_model_len=512)
    assert llm.llm_engine.model_config.dtype.is_floating_point
    assert str(llm.llm_engine.executor.runner.kv_pool.dtype) == "torch.bfloat16"
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}], SamplingParams(temperature=0, max_tokens=12))
    assert "Paris" in out[0].outputs[0].text
    auto = "bfloat16" if cpu_has_amx_bf16() else "float32"
    assert str(resolve_dtype("auto", None, torch.device("cpu"))) == f"torch.{auto}"


def _run_tracking_blocks(llm, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], int]:
    """Greedy tokens per prompt, and the most blocks any one decoding sequence held at once."""
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), {"prompt_token_ids": p}, params)
    done: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    most = 0
    while engine.has_unfinished_requests():
        for out in engine.step():  # engine outputs are deltas
            done[out.request_id] += out.outputs[0].token_ids if out.outputs else []
        decoding = [s for s in engine.scheduler.running if s.num_output_tokens > 1]
        most = max([most] + [len(s.block_table) - s.num_freed_blocks for s in decoding])
    return [done[str(i)] for i in range(len(prompts))], most


def test_sliding_window_models_run_windowed_attention_over_the_whole_context(tmp_path):
    """Mistral-style window on every layer: the whole context is served (no cap at the window), and blocks
    behind the window go back to the pool, so a long sequence holds about window / block_size + 1 blocks;
    tokens stay HF's alone, in a batch, on a prefix-cache hit past the window and under preemption."""
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
    llm = LLM(str(folder), kv_cache_memory=16 << 20, block_size=8, dtype="float32")
    assert llm.llm_engine.max_model_len == 512  # no longer capped at the window
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = tok.encode("The quick brown fox jumps over the lazy dog " * 4)  # longer than the window
    expected = hf_greedy(hf, tok, ids, 40)
    tokens, most = _run_tracking_blocks(llm, [ids], 40)
    assert tokens == [expected]
    assert most == 16 // 8 + 1  # the window's blocks and the one being written, however long the sequence
    bm = llm.llm_engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    # A longer prompt starting with the same tokens: a prefix hit far past the window takes back only the
    # blocks inside it.
    longer = ids + expected[:-2]
    out = llm.generate({"prompt_token_ids": longer}, SamplingParams(temperature=0, max_tokens=12))[0]
    assert out.num_cached_tokens >= len(ids) - 8 and out.outputs[0].token_ids == hf_greedy(hf, tok, longer, 12)

    # 6 blocks of 8 tokens hold none of these sequences whole (prompt + 40 > 48 tokens), let alone three: only
    # freeing behind the window lets them finish; the pool still forces preemption and chunked prefill.
    prompts = [ids, tok.encode("Once upon a time, in a village by the sea, there lived a clockmaker"), ids[:30]]
    tight = LLM(str(folder), num_gpu_blocks_override=6, block_size=8, max_num_batched_tokens=16, dtype="float32")
    tokens, most = _run_tracking_blocks(tight, prompts, 40)
    assert tokens == [expected, *(hf_greedy(hf, tok, p, 40) for p in prompts[1:])]
    assert tight.llm_engine.scheduler.num_preemptions > 0 and most == 16 // 8 + 1
    bm = tight.llm_engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    # n=2 forks the second completion off a prompt whose first blocks are already freed (chunked prefill).
    fork = LLM(str(folder), num_gpu_blocks_override=10, block_size=8, max_num_batched_tokens=16, dtype="float32")
    out = fork.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=20, n=2))[0]
    assert [c.token_ids for c in out.outputs] == [expected[:20]] * 2
    bm = fork.llm_engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks
