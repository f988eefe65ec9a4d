"""Speculative decoding (n-gram prompt lookup and a draft model): greedy tokens identical to decoding without
it (alone, batched, with stops, grammars and prefix hits), the rejection sampler distribution-exact (a
chi-square test on a small vocabulary), no KV block leaked after aborts mid-speculation, and the config errors.

The engines load the demo GGUF dequantized to float32 (WSLM_GGUF_DEQUANTIZE=1): on its Q4_1 blocks the
one-token C step and the batched verification round differently (the GEMV quantizes activations), so a near
tie could flip between the two paths with or without speculation; dense float32 computes the same math."""

from __future__ import annotations

import json

import pytest
import torch
from scipy.stats import chisquare

from wslm.backend import LLM, SamplingParams, StructuredOutputsParams
from wslm.backend.spec_decode.config import fold_legacy_flags, parse_speculative_config
from wslm.backend.spec_decode.ngram import propose_ngram
from wslm.backend.spec_decode.rejection import accept_greedy, accept_sampled

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
QUOTE = ("Copy this list exactly, then stop.\nalpha, beta, gamma, delta, epsilon, zeta, eta, theta, iota, kappa\n"
         "alpha, beta, gamma, delta, epsilon, zeta, eta, theta, iota, kappa\nalpha, beta,")
PROMPTS = [QUOTE, "def add(a, b):\n    return a + b\n\n\ndef add(a, b, c):\n", "The capital of France is"]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


# ---- no model ---------------------------------------------------------------------------------
def test_config_parsing_and_errors():
    cfg = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}')
    assert (cfg.method, cfg.num_speculative_tokens, cfg.prompt_lookup_max, cfg.prompt_lookup_min) == ("ngram", 3, 3, 3)
    cfg = parse_speculative_config({"method": "ngram", "num_speculative_tokens": 3})  # vLLM's defaults
    assert (cfg.prompt_lookup_max, cfg.prompt_lookup_min) == (5, 5)
    cfg = parse_speculative_config({"model": "demo", "num_speculative_tokens": 2})
    assert (cfg.method, cfg.model) == ("draft_model", "demo")
    assert parse_speculative_config({"method": "draft_model", "model": "x", "num_speculative_tokens": 1}).model == "x"
    assert parse_speculative_config(None) is None
    bad = [
        ({"method": "eagle", "num_speculative_tokens": 2}, "unknown method 'eagle'"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "from 1 to 16"),
        ({"method": "ngram", "num_speculative_tokens": 99}, "from 1 to 16"),
        ({"method": "ngram"}, "needs num_speculative_tokens"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, 'needs "model"'),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5, "prompt_lookup_max": 2},
         "make min <= max"),
        ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 1}, "unknown key(s) lookahead"),
        ("{not json", "not valid JSON"),
    ]
    for value, message in bad:
        with pytest.raises(ValueError) as exc:
            parse_speculative_config(value)
        assert message in str(exc.value), (value, str(exc.value))
    assert fold_legacy_flags(None, "[ngram]", 3, 2, None) == {"num_speculative_tokens": 3, "method": "ngram",
                                                              "prompt_lookup_max": 2}
    with pytest.raises(ValueError, match="not both"):
        fold_legacy_flags("{}", "demo", 2, None, None)
    with pytest.raises(ValueError, match="tensor-parallel-size 1"):
        from wslm.backend.config import EngineConfig

        EngineConfig(speculative_config=NGRAM, tensor_parallel_size=2)


def test_ngram_lookup():
    assert propose_ngram([1, 2, 3, 4, 5, 9, 1, 2, 3], 3, 1, 4) == [4, 5, 9]
    assert propose_ngram([7, 1, 8, 2, 3, 9, 2, 3], 2, 1, 4) == [9, 2]  # the longest match wins: "2 3"
    assert propose_ngram([1, 2, 3, 4], 3, 1, 4) == []  # nothing recurs
    assert propose_ngram([5, 6, 5], 3, 2, 4) == []  # only a 1-gram recurs, min is 2


def test_rejection_sampler_matches_the_target_distribution():
    """Point-mass drafts: every emitted token must follow the target's p, whatever was proposed."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.05, 0.40, 0.25, 0.10, 0.15, 0.05],
                      [0.30, 0.10, 0.20, 0.10, 0.10, 0.20],
                      [0.10, 0.10, 0.10, 0.40, 0.20, 0.10]])
    drafts = [1, 5]  # a likely token, then an unlikely one
    scale = torch.tensor([[0.5], [2.0], [1.0]])  # rows as min-p leaves them: not normalized
    n = 6000
    first = torch.zeros(6)
    second = torch.zeros(6)
    third = torch.zeros(6)
    for _ in range(n):
        out = accept_sampled(p * scale, drafts, torch.empty(3, 6).exponential_(generator=g))
        first[out[0]] += 1
        if out[0] == drafts[0]:
            second[out[1]] += 1
            if out[1] == drafts[1]:
                third[out[2]] += 1
    for counts, row in ((first, p[0]), (second, p[1]), (third, p[2])):
        total = counts.sum()
        assert total > 100
        assert chisquare(counts.numpy(), (row * total).numpy()).pvalue > 1e-3, (counts, row)
    assert accept_greedy([4, 7, 9], [4, 8]) == [4, 7]
    assert accept_greedy([4, 8, 9], [4, 8]) == [4, 8, 9]


# ---- engines on the demo model ----------------------------------------------------------------
@pytest.fixture(scope="module")
def engines():
    mp = pytest.MonkeyPatch()
    mp.setenv("WSLM_GGUF_DEQUANTIZE", "1")
    common = dict(dtype="float32", num_gpu_blocks_override=160, max_model_len=1024, max_num_seqs=8)
    base = LLM("demo", **common)
    ngram = LLM("demo", speculative_config=NGRAM, **common)
    yield base, ngram
    mp.undo()


def _tokens(llm, prompts, params=GREEDY):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def _free(llm) -> bool:
    bm = llm.llm_engine.block_manager
    return bm.num_free_blocks == bm.num_blocks


def test_ngram_greedy_identical_alone_and_batched(engines):
    base, ngram = engines
    want = _tokens(base, PROMPTS)
    before = ngram.llm_engine.get_stats()
    assert _tokens(ngram, PROMPTS[:1]) == want[:1]
    assert _tokens(ngram, PROMPTS) == want
    stats = ngram.llm_engine.get_stats()
    accepted = stats["spec_decode_num_accepted_tokens"] - before["spec_decode_num_accepted_tokens"]
    assert stats["spec_decode_num_drafts"] > before["spec_decode_num_drafts"] and accepted > 10
    assert _free(ngram)
    # a prompt whose prefix is cached (the same prompt again): same tokens
    assert _tokens(ngram, PROMPTS[:1]) == want[:1]


def test_stops_inside_an_accepted_run(engines):
    base, ngram = engines
    for params in (SamplingParams(temperature=0, max_tokens=7, ignore_eos=True),
                   SamplingParams(temperature=0, max_tokens=40, stop=["epsilon"])):
        want = base.generate([QUOTE], params)[0].outputs[0]
        got = ngram.generate([QUOTE], params)[0].outputs[0]
        assert (got.text, got.token_ids, got.finish_reason) == (want.text, want.token_ids, want.finish_reason)
    assert _free(ngram)


def test_grammar_logprobs_and_penalties_per_verified_position(engines):
    base, ngram = engines
    schema = {"type": "object", "properties": {"names": {"type": "array", "items": {"type": "string"},
                                                         "maxItems": 4}}, "required": ["names"]}
    params = [
        SamplingParams(temperature=0, max_tokens=40, structured_outputs=StructuredOutputsParams(json=schema)),
        SamplingParams(temperature=0, max_tokens=16, logprobs=2, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=16, frequency_penalty=0.3, ignore_eos=True),
    ]
    prompt = QUOTE + ' As JSON: {"names": ["alpha", "beta", "gamma"]} and again: '
    for sp in params:
        want = base.generate([prompt], sp)[0].outputs[0]
        got = ngram.generate([prompt], sp)[0].outputs[0]
        assert got.token_ids == want.token_ids, sp
        if sp.structured_outputs is not None:
            json.loads(got.text)
        if sp.logprobs:
            assert len(got.logprobs) == len(want.logprobs)
            for a, b in zip(got.logprobs, want.logprobs):
                assert set(a) == set(b)
                for t in a:
                    assert abs(a[t].logprob - b[t].logprob) < 1e-3


def test_seeded_sampling_is_reproducible_and_the_same_as_without_speculation(engines):
    """A seeded request's noise is keyed by its token's position (sampler.at_position), and a verified position
    takes the plain sampler's token (rejection.accept_sampled): its tokens do not depend on how many tokens each
    step proposed, which the adaptive K chooses from measured step times."""
    base, ngram = engines
    sp = SamplingParams(temperature=0.8, top_p=0.95, seed=7, max_tokens=24, ignore_eos=True)
    before = ngram.llm_engine.get_stats()["spec_decode_num_accepted_tokens"]
    got = _tokens(ngram, [QUOTE], sp)
    assert ngram.llm_engine.get_stats()["spec_decode_num_accepted_tokens"] > before  # some ran speculatively
    assert got == _tokens(ngram, [QUOTE], sp)
    assert got == _tokens(base, [QUOTE], sp)


def test_no_block_leaked_after_aborts_mid_speculation(engines):
    _, ngram = engines
    eng = ngram.llm_engine
    for i, p in enumerate(PROMPTS * 2):
        eng.add_request(f"abort-{i}", p, SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
    drafts = eng.get_stats()["spec_decode_num_drafts"]
    for _ in range(200):
        eng.step()
        if eng.get_stats()["spec_decode_num_drafts"] > drafts + 8:
            break
    assert any(s.num_computed_tokens > 0 for s in eng.scheduler.running)
    eng.abort_request([f"abort-{i}" for i in range(len(PROMPTS) * 2)])
    while eng.has_unfinished_requests():
        eng.step()
    assert _free(ngram)


def test_draft_model_greedy_identical(engines):
    """The demo as its own draft: every proposal should be accepted, and the tokens are the same."""
    base, _ = engines
    mp = pytest.MonkeyPatch()
    mp.setenv("WSLM_GGUF_DEQUANTIZE", "1")
    try:
        draft = LLM("demo", dtype="float32", num_gpu_blocks_override=160, max_model_len=1024, max_num_seqs=8,
                    speculative_config={"model": "demo", "num_speculative_tokens": 3})
        want = _tokens(base, PROMPTS[:2])
        assert _tokens(draft, PROMPTS[:1]) == want[:1]
        assert _tokens(draft, PROMPTS[:2]) == want
        stats = draft.llm_engine.get_stats()
        assert stats["spec_decode_num_draft_tokens"] > 30
        assert stats["spec_decode_num_accepted_tokens"] >= 0.95 * stats["spec_decode_num_draft_tokens"]
        assert _free(draft)
    finally:
        mp.undo()


def test_a_draft_models_keys_and_values_count_in_the_kv_budget(engines):
    """The draft's pool has the target's block ids, so each block costs both models' keys and values: with the
    demo as its own draft the same --kv-cache-memory holds half the blocks."""
    base, _ = engines
    mp = pytest.MonkeyPatch()
    mp.setenv("WSLM_GGUF_DEQUANTIZE", "1")
    try:
        common = dict(dtype="float32", kv_cache_memory=64 << 20, max_model_len=512, max_num_seqs=8)
        alone = LLM("demo", **common).llm_engine.block_manager.num_blocks
        draft = LLM("demo", speculative_config={"model": "demo", "num_speculative_tokens": 3}, **common)
        executor = draft.llm_engine.core.executor
        assert draft.llm_engine.block_manager.num_blocks == alone // 2
        assert executor.draft.runner.num_blocks == alone // 2
        assert executor.draft.runner.kv_cache_bytes + executor.runner.kv_cache_bytes <= 64 << 20
        assert executor.kv_cache_bytes == executor.draft.runner.kv_cache_bytes + executor.runner.kv_cache_bytes
        with pytest.raises(ValueError, match="draft model's keys and values share"):  # the error says why
            LLM("demo", speculative_config={"model": "demo", "num_speculative_tokens": 3},
                **{**common, "max_model_len": 1024})
    finally:
        mp.undo()


def test_models_info_counts_a_draft_model_as_the_server_does(capsys):
    """`wslm models info` / `list --speculative-config` count the draft's weights and its keys and values in every
    block (the engine's rule above: the same pool bytes hold half the blocks with the demo as its own draft);
    a draft that is not on this machine, or a config serve refuses, is a clear error."""
    from test_models_catalog import run_cli

    from wslm.backend.hub.catalog import find_model

    common = dict(context=512, kv_cache_memory=64 << 20, max_num_seqs=8)
    alone = find_model("demo", **common)
    spec = find_model("demo", speculative_config={"model": "demo", "num_speculative_tokens": 3}, **common)
    assert spec.kv_cache_blocks == alone.kv_cache_blocks // 2
    assert spec.draft_kv_bytes_per_token == alone.kv_bytes_per_token
    assert spec.weights_memory_bytes == 2 * alone.weights_memory_bytes == 2 * spec.draft_weights_memory_bytes
    assert spec.memory_estimate_bytes == alone.memory_estimate_bytes + alone.weights_memory_bytes
    ngram = find_model("demo", speculative_config=NGRAM, **common)  # no second model: nothing added
    assert ngram.kv_cache_blocks == alone.kv_cache_blocks and ngram.draft_model is None
    rc, out = run_cli("models", "info", "demo", "--speculative-config", '{"model": "demo", "num_speculative_tokens": 3}',
                      capsys=capsys)  # fmt: skip
    assert rc == 0 and "Draft model:" in out
    rc, out = run_cli("models", "info", "demo", "--json", "--speculative-config",
                      '{"model": "/nowhere/draft.gguf", "num_speculative_tokens": 3}', capsys=capsys)  # fmt: skip
    assert rc != 0 and "no draft model" in json.loads(out)["error"]["message"]
    with pytest.raises(ValueError, match="unknown method"):
        find_model("demo", speculative_config={"method": "eagle", "num_speculative_tokens": 3})
    # `models list` (the GUI's estimates) takes the same flag: the draft beside each model, one error if missing
    from wslm.backend.hub.catalog import list_models

    listed = {m.id: m for m in list_models(speculative_config={"model": "demo", "num_speculative_tokens": 3}, **common)}
    assert listed["demo"].memory_estimate_bytes == spec.memory_estimate_bytes and listed["demo"].draft_model == "demo"
    rc, out = run_cli("models", "list", "--json", "--speculative-config", '{"model": "demo", "num_speculative_tokens": 3}',
                      capsys=capsys)  # fmt: skip
    assert rc == 0 and all(m["draft_model"] == "demo" for m in json.loads(out)["models"] if m["complete"])
    rc, out = run_cli("models", "list", "--json", "--speculative-config",
                      '{"model": "/nowhere/draft.gguf", "num_speculative_tokens": 3}', capsys=capsys)  # fmt: skip
    assert rc != 0 and "no draft model" in json.loads(out)["error"]["message"]


def test_speculating_beside_a_prefill(engines):
    """One stream speculates while a newcomer's prompt is prefilled in the same steps (a mixed batch)."""
    base, ngram = engines
    want = _tokens(base, PROMPTS[:2])
    eng = ngram.llm_engine
    done: dict[str, list[int]] = {"first": [], "second": []}

    def step() -> None:
        for out in eng.step():  # deltas: a speculative step's tokens arrive together
            done[out.request_id] += out.outputs[0].token_ids

    eng.add_request("first", PROMPTS[0], GREEDY)
    drafts = eng.get_stats()["spec_decode_num_drafts"]
    while eng.get_stats()["spec_decode_num_drafts"] == drafts:
        step()
    eng.add_request("second", PROMPTS[1], GREEDY)
    while eng.has_unfinished_requests():
        step()
    assert [done["first"], done["second"]] == want
    assert _free(ngram)


def test_preemption_and_forks_mid_speculation(engines):
    """A pool too small for the batch: sequences are preempted while speculating and recomputed; n > 1
    siblings fork and speculate on their own. Same tokens as without speculation, every block back."""
    base, _ = engines
    mp = pytest.MonkeyPatch()
    mp.setenv("WSLM_GGUF_DEQUANTIZE", "1")
    try:
        small = LLM("demo", dtype="float32", num_gpu_blocks_override=24, max_model_len=256, max_num_seqs=8,
                    speculative_config=NGRAM)
    finally:
        mp.undo()
    sp = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    assert _tokens(small, PROMPTS * 3, sp) == _tokens(base, PROMPTS * 3, sp)
    stats = small.llm_engine.get_stats()
    assert stats["num_preemptions_total"] > 0 and stats["spec_decode_num_accepted_tokens"] > 0
    fan = SamplingParams(temperature=0, max_tokens=16, n=3, ignore_eos=True)
    assert ([c.token_ids for c in small.generate(PROMPTS[:1], fan)[0].outputs]
            == [c.token_ids for c in base.generate(PROMPTS[:1], fan)[0].outputs])
    assert _free(small)


def test_draft_with_another_tokenizer_is_refused(tmp_path):
    """A draft whose vocabulary differs from the target's, even by two swapped ids, is an error naming the fix."""
    from engine_helpers import demo_tokenizer, make_tiny_model

    from wslm.backend.spec_decode.draft import check_draft_tokenizer

    target = demo_tokenizer()
    folder = make_tiny_model(tmp_path / "draft", "llama", target)
    check_draft_tokenizer(target, str(folder))  # the same tokenizer: fine
    spec = json.loads((folder / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = "hello", "world"
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="another tokenizer than the served model.*same tokenizer.*ngram"):
        check_draft_tokenizer(target, str(folder))
