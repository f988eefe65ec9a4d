"""Continuous batching, prefix caching, chunked prefill, preemption and abort on the demo model."""

import contextlib

import pytest

from wslm.backend import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)

PROMPTS = [
    "The history of the Roman Empire",
    "Write a haiku about autumn leaves.",
    "1, 2, 3, 4,",
    "Python is a programming language that",
    "Once upon a time, in a small village near the mountains, there lived an old clockmaker who",
    "Q: What is 2 + 2?\nA:",
    "The best way to learn a new language is",
    "Hi",
] * 2


def test_prompt_alone_equals_prompt_in_mixed_batch(demo_llm):
    alone = [demo_llm.generate(p, GREEDY)[0].outputs[0].token_ids for p in PROMPTS[:3]]
    batch = demo_llm.generate(PROMPTS, GREEDY)
    assert len(batch) == 16
    for i in range(3):
        assert batch[i].outputs[0].token_ids == alone[i]
        assert batch[i + 8].outputs[0].token_ids == alone[i]
    assert demo_llm.llm_engine.block_manager.num_free_blocks == demo_llm.llm_engine.block_manager.num_blocks


def test_multi_turn_chat_reuses_first_turn_blocks(demo_llm):
    params = SamplingParams(temperature=0, max_tokens=12)
    turn1 = [{"role": "user", "content": "Tell me one fact about the Moon."}]
    first = demo_llm.chat(turn1, params)[0]
    turn2 = turn1 + [
        {"role": "assistant", "content": first.outputs[0].text},
        {"role": "user", "content": "And one about Mars?"},
    ]
    second = demo_llm.chat(turn2, params)[0]
    # Everything up to the last full block of turn one is shared.
    first_len = len(first.prompt_token_ids)
    assert second.num_cached_tokens >= (first_len // 16) * 16 > 0
    with prefix_caching_off(demo_llm):
        fresh = demo_llm.generate({"prompt_token_ids": second.prompt_token_ids}, params)[0]
    assert fresh.num_cached_tokens == 0
    assert fresh.outputs[0].token_ids == second.outputs[0].token_ids


@contextlib.contextmanager
def prefix_caching_off(llm):
    """The same engine with prefix caching switched off, for one comparison."""
    bm = llm.llm_engine.block_manager
    bm.enable_prefix_caching = False
    try:
        yield
    finally:
        bm.enable_prefix_caching = True


def test_prefix_cache_hit_gives_identical_output(demo_llm):
    prompt = "In a distant galaxy, a small crew of explorers discovered a planet covered in glass forests. " * 2
    a = demo_llm.generate(prompt, GREEDY)[0]
    b = demo_llm.generate(prompt, GREEDY)[0]
    assert a.num_cached_tokens == 0 or a.num_cached_tokens < b.num_cached_tokens
    assert b.num_cached_tokens >= 16
    assert a.outputs[0].token_ids == b.outputs[0].token_ids


def test_chunked_prefill_and_preemption_keep_outputs(tiny_models):
    folder = str(tiny_models["llama"])
    prompts = [f"Story number {i}: the dragon and the " + "lantern " * (5 + 3 * i) for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    # float32: in bf16, a prompt computed in chunks rounds differently from one computed whole.
    roomy = LLM(folder, kv_cache_memory=16 << 20, dtype="float32")
    expected = [o.outputs[0].token_ids for o in roomy.generate(prompts, params)]
    # 24 blocks of 8 tokens cannot hold six 60-90 token sequences at once: preemption must happen,
    # and a 32-token budget forces prompts through in chunks.
    tight = LLM(folder, num_gpu_blocks_override=24, block_size=8, max_num_batched_tokens=32, max_model_len=128,
                dtype="float32")
    got = [o.outputs[0].token_ids for o in tight.generate(prompts, params)]
    engine = tight.llm_engine
    assert engine.scheduler.num_preemptions > 0
    assert got == expected
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_abort_frees_blocks_at_any_time(demo_llm):
    engine = demo_llm.llm_engine
    bm = engine.block_manager
    engine.add_request("a1", "Count from one to one hundred:", SamplingParams(max_tokens=200, ignore_eos=True))
    engine.add_request("a2", "Another long story begins", SamplingParams(max_tokens=200, ignore_eos=True))
    for _ in range(3):
        engine.step()
    assert bm.num_free_blocks < bm.num_blocks
    engine.abort_request("a1")
    outs = engine.step()
    aborted = [o for o in outs if o.request_id == "a1"]
    assert aborted and aborted[0].finished and aborted[0].outputs[0].finish_reason == "abort"
    engine.abort_request(["a2", "never-existed"])
    while engine.has_unfinished_requests():
        engine.step()
    assert bm.num_free_blocks == bm.num_blocks


def test_bad_requests_raise_and_engine_keeps_serving(demo_llm):
    engine = demo_llm.llm_engine
    engine.add_request("good", "Hello", SamplingParams(temperature=0, max_tokens=4))
    with pytest.raises(ValueError, match="empty"):
        engine.add_request("bad1", "", SamplingParams())
    with pytest.raises(ValueError, match="maximum context length is 2048"):
        engine.add_request("bad2", {"prompt_token_ids": [1] * 2048}, SamplingParams())
    with pytest.raises(ValueError, match=r"2100 tokens \(100 in the prompt, 2000 in the completion\)"):
        engine.add_request("bad3", {"prompt_token_ids": [1] * 100}, SamplingParams(max_tokens=2000))
    with pytest.raises(ValueError, match="out of range"):
        engine.add_request("bad4", [10**9], SamplingParams())
    # Limits (validation.py, shared with the server): n against max_num_seqs (32 here), the KV pool, stops.
    with pytest.raises(ValueError, match="n must be at most 32"):
        engine.add_request("bad5", "Hello", SamplingParams(n=33))
    pool = engine.block_manager.num_blocks * engine.block_manager.block_size
    with pytest.raises(ValueError, match="can never fit the KV cache") as exc:
        engine.add_request("bad6", "Hello", SamplingParams(n=32, max_tokens=pool // 16))
    assert exc.value.param == "n" and exc.value.code == "kv_cache_exceeded"
    with pytest.raises(ValueError, match="--max-stop-strings"):
        engine.add_request("bad7", "Hello", SamplingParams(stop=[str(i) for i in range(65)]))
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("good", "Hello", SamplingParams())
    done = []
    while engine.has_unfinished_requests():
        done += [o for o in engine.step() if o.finished]
    assert [o.request_id for o in done] == ["good"]
