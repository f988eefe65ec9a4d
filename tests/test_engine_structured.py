"""Engine level: grammar masks in the batched sampler (alone and mixed with free requests, under chunked
prefill and preemption), prompt_logprobs against HF, logit_bias / allowed_token_ids / bad_words, truncation."""

from __future__ import annotations

import json
import re

import pytest
import torch

from wslm.backend import LLM, SamplingParams, StructuredOutputsParams
from wslm.backend.structured import GrammarError, GuidedDecodingParams

GREEDY = dict(temperature=0.0)


def test_grammar_mask_mixed_batch(demo_llm):
    schema = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"enum": ["a", "b"]}},
              "required": ["x", "y"]}
    free = SamplingParams(max_tokens=12, **GREEDY)
    prompts = ["Point as JSON:", "Once upon a time", "Answer yes or no: is water wet?", "Digits:"]
    params = [
        SamplingParams(max_tokens=60, seed=1, temperature=0.9, structured_outputs=StructuredOutputsParams(json=schema)),
        free,
        SamplingParams(max_tokens=5, guided_decoding=GuidedDecodingParams(choice=["yes", "no"])),
        SamplingParams(max_tokens=20, n=3, seed=2, temperature=1.0,
                       structured_outputs=StructuredOutputsParams(regex=r"[0-9]{4,8}")),
    ]
    outs = demo_llm.generate(prompts, params)
    obj = json.loads(outs[0].outputs[0].text)
    assert set(obj) == {"x", "y"} and isinstance(obj["x"], int) and obj["y"] in ("a", "b")
    assert outs[0].outputs[0].finish_reason == "stop"
    # The unconstrained request in the same batch is exactly what it is alone.
    assert outs[1].outputs[0].token_ids == demo_llm.generate(prompts[1], free)[0].outputs[0].token_ids
    assert outs[2].outputs[0].text in ("yes", "no") and outs[2].outputs[0].finish_reason == "stop"
    assert len(outs[3].outputs) == 3 and all(re.fullmatch(r"[0-9]{4,8}", c.text) for c in outs[3].outputs)
    assert demo_llm.llm_engine.block_manager.num_free_blocks == demo_llm.llm_engine.block_manager.num_blocks


def test_invalid_grammar_raises_and_queues_nothing(demo_llm):
    with pytest.raises(GrammarError, match="Invalid regular expression"):
        demo_llm.generate("x", SamplingParams(structured_outputs=StructuredOutputsParams(regex="(")))
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["b"])
    assert not demo_llm.llm_engine.requests


def test_grammar_state_resyncs_after_replay(demo_llm):
    compiler = demo_llm.llm_engine.structured
    compiled = compiler.compile_choice(["alpha", "beta"])
    assert compiler.compile(StructuredOutputsParams(choice=["alpha", "beta"])) is compiled  # cached by value
    tok = demo_llm.get_tokenizer()
    ids = tok.encode("beta", add_special_tokens=False)
    state = compiler.new_state(compiled)
    state.sync(ids)  # as after a lost state: replays the generated tokens
    assert state.num_accepted == len(ids)
    eos = tok.eos_token_id
    assert state.accept(eos) and state.is_terminated()


def test_preemption_and_chunks_keep_grammar_and_prompt_logprobs(tiny_models):
    folder = str(tiny_models["llama"])
    prompts = [f"Story {i}: the dragon and the " + "lantern " * (4 + 3 * i) for i in range(6)]
    params = [SamplingParams(max_tokens=40, seed=i, temperature=1.0, prompt_logprobs=2 if i % 2 else None,
                             structured_outputs=StructuredOutputsParams(regex=r"[a-z]{20,200}") if i % 3 else None)
              for i in range(6)]
    roomy = LLM(folder, kv_cache_memory=16 << 20, dtype="float32")
    expected = roomy.generate(prompts, params)
    tight = LLM(folder, num_gpu_blocks_override=24, block_size=8, max_num_batched_tokens=32, max_model_len=128,
                dtype="float32")
    got = tight.generate(prompts, params)
    assert tight.llm_engine.scheduler.num_preemptions > 0
    for i, (a, b) in enumerate(zip(expected, got)):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        if i % 3:
            assert re.fullmatch(r"[a-z]{20,200}", b.outputs[0].text), b.outputs[0].text
        if i % 2:
            assert len(b.prompt_logprobs) == len(b.prompt_token_ids) and b.prompt_logprobs[0] is None
            for x, y in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:]):
                assert x.keys() == y.keys()
                assert all(abs(x[t].logprob - y[t].logprob) < 1e-4 for t in x)
        else:
            assert b.prompt_logprobs is None
    bm = tight.llm_engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_prompt_logprobs_match_hf(demo_llm, demo_hf_model):
    tok = demo_llm.get_tokenizer()
    text = "The quick brown fox jumps over the lazy dog because it was"
    ids = tok.encode(text)
    params = SamplingParams(max_tokens=1, prompt_logprobs=3, **GREEDY)
    for _ in range(2):  # the second run would hit the prefix cache: prompt_logprobs must bypass it
        out = demo_llm.generate({"prompt_token_ids": ids}, params)[0]
        with torch.no_grad():
            ref = torch.log_softmax(demo_hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(ids)
        for pos in range(1, len(ids)):
            entry = out.prompt_logprobs[pos]
            assert abs(entry[ids[pos]].logprob - ref[pos - 1, ids[pos]].item()) < 1e-3
            top = ref[pos - 1].topk(3).indices.tolist()
            assert {t for t, e in entry.items() if e.rank <= 3} == set(top)


def test_logit_bias_allowed_tokens_bad_words_truncation(demo_llm):
    tok = demo_llm.get_tokenizer()
    prompt = "The capital of France is"
    base = demo_llm.generate(prompt, SamplingParams(max_tokens=6, **GREEDY))[0].outputs[0]
    assert "Paris" in base.text
    forced = tok.encode(" banana", add_special_tokens=False)[0]
    out = demo_llm.generate(prompt, SamplingParams(max_tokens=4, logit_bias={forced: 100}, **GREEDY))[0].outputs[0]
    assert out.token_ids == [forced] * 4
    out = demo_llm.generate(prompt, SamplingParams(max_tokens=1, logit_bias={str(base.token_ids[0]): -100},
                                                   **GREEDY))[0].outputs[0]
    assert out.token_ids[0] != base.token_ids[0]
    allowed = tok.encode(" yes no", add_special_tokens=False)
    out = demo_llm.generate(prompt, SamplingParams(max_tokens=5, seed=0, allowed_token_ids=allowed))[0].outputs[0]
    assert set(out.token_ids) <= set(allowed)
    out = demo_llm.generate(prompt, SamplingParams(max_tokens=6, bad_words=["Paris"], **GREEDY))[0].outputs[0]
    assert "Paris" not in out.text
    with pytest.raises(ValueError, match=r"logit_bias values must be in \[-100, 100\]"):
        SamplingParams(logit_bias={1: 101})
    with pytest.raises(ValueError, match="max-logprobs"):  # -1 (whole vocabulary) needs --max-logprobs -1
        demo_llm.generate(prompt, SamplingParams(logprobs=-1))
    with pytest.raises(ValueError, match="out of range"):
        demo_llm.generate(prompt, SamplingParams(logit_bias={10**7: 1}))
    out = demo_llm.generate(prompt, SamplingParams(max_tokens=2, truncate_prompt_tokens=3, **GREEDY))[0]
    assert out.prompt_token_ids == tok.encode(prompt)[-3:]


def test_constraint_after_the_think_block():
    """With a reasoning model the constraint starts after `</think>` (vLLM's behaviour): a reply that opens
    its own think block (Qwen3) may think first or answer at once; one that starts inside it (the prompt
    opened it, DeepSeek-R1) must close it before answering."""
    import xgrammar as xgr
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from wslm.backend.structured.compiler import StructuredOutputCompiler
    from wslm.backend.structured.reasoning import after_reasoning

    chars = [chr(i) for i in range(32, 127)] + ["\n", "</s>"]
    raw = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)}, unk_token="</s>"))
    raw.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    compiler = StructuredOutputCompiler(PreTrainedTokenizerFast(tokenizer_object=raw), len(chars), [len(chars) - 1])

    def accepts(spec, text: str) -> bool:
        matcher = xgr.GrammarMatcher(compiler.compile(spec).xgr)
        return matcher.accept_string(text) and matcher.accept_token(len(chars) - 1) and matcher.is_terminated()

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    for spec in (StructuredOutputsParams(json=schema), StructuredOutputsParams(json_object=True)):
        opens = after_reasoning(spec, starts_inside=False)
        assert accepts(opens, '<think>Hm, {a} is 1.</think>\n\n{"a": 1}') and accepts(opens, '{"a": 1}')
        assert not accepts(opens, '<think>Hm.</think>a = 1') and not accepts(opens, "Hm.</think>{\"a\": 1}")
        inside = after_reasoning(spec, starts_inside=True)
        assert accepts(inside, 'Hm.</think>{"a": 1}') and not accepts(inside, '{"a": 1}')
    assert accepts(StructuredOutputsParams(json_object=True), '{"b": [1]}')
    assert accepts(after_reasoning(StructuredOutputsParams(json_object=True), False), '{"b": [1]}')
    choice = after_reasoning(StructuredOutputsParams(choice=["yes", "no"]), starts_inside=True)
    assert accepts(choice, "Sure.</think> no") and not accepts(choice, "Sure.</think>maybe")
    # tool_choice "required"'s JSON array keeps its whitespace rule (xgrammar's one-space form) behind the block.
    calls = StructuredOutputsParams(json={"type": "array", "items": schema, "minItems": 1}, disable_any_whitespace=True)
    for reply in ('[{"a": 1}]', '[{"a":1}]', '[ {"a": 1} ]'):
        assert accepts(after_reasoning(calls, False), "<think>x</think>" + reply) == accepts(calls, reply)
    assert accepts(calls, '[{"a": 1}]') and not accepts(calls, '[ {"a": 1} ]')
    whole = StructuredOutputsParams(choice=["<think>Hm.</think>Yes."])  # spells out the think block itself
    assert after_reasoning(whole, starts_inside=False) is whole
    regex = after_reasoning(StructuredOutputsParams(regex=r"\d{3}"), starts_inside=False)
    assert accepts(regex, "<think>x</think>123") and not accepts(regex, "<think>x</think>12")
