"""Several rows of one sequence in one C call (wslm/backend/platforms/cpu/decode_rows.py, wslm_decode_rows in
wslm/kernels/cpu_layer.c), what a lone chat's speculative verification runs: on the same inputs and KV pool
its logits and the pool it leaves are bit for bit those of the rows' one-row C steps taken in turn, and agree
with the eager step's to rounding, for every weight kind (int4, int8 with biases, dense, the demo's GGUF
blocks) in bfloat16 and float32; rows of several sequences are left to the batch path."""

from __future__ import annotations

import pytest
import torch

from wslm.backend import LLM, SamplingParams
from wslm.backend.modeling.layers.attention import AttentionMetadata
from wslm.backend.platforms.cpu.decode_rows import run_rows
from wslm.kernels import cpu_gemv

pytestmark = pytest.mark.skipif(cpu_gemv.library() is None, reason="no C compiler: the C kernels are not built")
PROMPT = "Once upon a time, in a village by the sea, there lived an old clockmaker"


def _last_table(llm: LLM, prompt: list[int], max_tokens: int) -> tuple[list[int], int, int]:
    """(the block table, the last position, the block size) of a greedy run's last decode step."""
    runner = llm.llm_engine.executor.runner
    seen = []
    tensorize = runner.tensorize

    def spy(step):
        seen.append((list(step.block_tables[0]), step.positions[-1]))
        return tensorize(step)

    runner.tensorize = spy
    try:
        llm.generate([{"prompt_token_ids": prompt}],
                     SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    finally:
        runner.tensorize = tensorize
    table, last = seen[-1]
    return table, last, runner.block_size


def _inputs(table: list[int], positions: list[int], ids: list[int], bs: int):
    """The step's tensors for rows at positions (one sequence, each row attending up to itself)."""
    m = len(positions)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor([table[p // bs] * bs + p % bs for p in positions], dtype=torch.int64),
        block_tables=torch.tensor([table] * m, dtype=torch.int32),
        cu_seqlens_q=torch.arange(m + 1, dtype=torch.int32),
        seq_lens=torch.tensor([p + 1 for p in positions], dtype=torch.int32),
        logits_indices=torch.arange(m, dtype=torch.int64),
        max_seqlen_q=1, max_seqlen_k=positions[-1] + 1,
    )  # fmt: skip
    return torch.tensor(ids, dtype=torch.int64), torch.tensor(positions, dtype=torch.int64), meta


def _check(llm: LLM, prompt: list[int], rows: int = 5, max_tokens: int = 12) -> None:
    runner = llm.llm_engine.executor.runner
    native = runner.native
    assert native is not None
    table, last, bs = _last_table(llm, prompt, max_tokens)
    positions = list(range(last - rows + 1, last + 1))  # crosses a block boundary (block_size 8 here)
    ids = [(p * 37) % 500 + 3 for p in positions]
    before = runner.kv_pool.clone()
    # the reference: each row as a one-row C step, in turn, on one thread
    one = []
    for i in range(rows):
        one.append(native.run(*_inputs(table, positions[i : i + 1], ids[i : i + 1], bs), threads=1))
    want, want_pool = torch.cat(one), runner.kv_pool.clone()
    runner.kv_pool.copy_(before)
    fixed = native.fixed_threads
    try:
        for threads in (1, 2, 3):  # the products split over threads by weight rows: the same bits
            native.fixed_threads = threads
            runner.kv_pool.copy_(before)
            got = run_rows(native, *_inputs(table, positions, ids, bs))
            assert got is not None
            assert torch.equal(got, want)
            assert torch.equal(runner.kv_pool, want_pool)  # the same keys and values, in the same slots only
    finally:
        native.fixed_threads = fixed
    # and the eager step (batched torch ops) to rounding: on GGUF blocks each product rounds its input to
    # int8, where a float difference of one ulp can move a code by one, and 30 layers amplify that (the demo's
    # blocks: 0.03-0.06 of the largest logit, depending on the prompt's KV; a wrong computation gives ~1)
    runner.kv_pool.copy_(before)
    eager = runner.cpu_decode.run(*_inputs(table, positions, ids, bs))
    assert float((eager - got).abs().max() / eager.abs().max()) < 0.1
    # rows that do not each attend up to their own position (a prompt chunk's layout) are not this path's
    ids_t, pos_t, meta = _inputs(table, positions, ids, bs)
    meta.seq_lens = torch.tensor([positions[0] + 1] * rows, dtype=torch.int32)
    assert run_rows(native, ids_t, pos_t, meta) is None
    runner.kv_pool.copy_(before)


@pytest.mark.parametrize("arch,kw,dtype", [("llama", {"quantization": "int4"}, "bfloat16"),
                                           ("qwen2", {"quantization": "int8"}, "float32"),
                                           ("llama", {}, "float32"), ("llama", {}, "bfloat16")])  # fmt: skip
def test_rows_equal_one_row_steps(arch, kw, dtype, tiny_models, demo_tok):
    llm = LLM(str(tiny_models[arch]), dtype=dtype, kv_cache_memory=16 << 20, block_size=8,
              max_model_len=256, enforce_eager=True, **kw)  # fmt: skip
    _check(llm, demo_tok.encode(PROMPT))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_rows_on_the_demo_gguf_blocks(dtype, demo_tok, monkeypatch):
    """The GGUF products take all rows per weight chunk (wslm_gguf_mm with M rows): still each row's bits."""
    monkeypatch.setenv("WSLM_GGUF_DEQUANTIZE", "0")
    llm = LLM("demo", dtype=dtype, kv_cache_memory=16 << 20, block_size=8, max_model_len=256, enforce_eager=True)
    assert llm.llm_engine.executor.runner.native is not None
    _check(llm, demo_tok.encode(PROMPT), rows=5)


def test_a_lone_chat_verifies_in_c_and_keeps_its_greedy_tokens(demo_tok, monkeypatch):
    """With n-gram speculation a lone chat's verification rows take the multi-row C step, and on the demo's
    GGUF blocks (no dequantizing) its greedy tokens are the ones it decodes without speculation."""
    from wslm.backend.platforms.cpu import decode_rows

    monkeypatch.setenv("WSLM_GGUF_DEQUANTIZE", "0")
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 2}
    # no prefix cache: a second run's prompt would be a shorter prefill, whose products round otherwise
    llm = LLM("demo", kv_cache_memory=32 << 20, max_model_len=512, enforce_eager=True, speculative_config=spec,
              enable_prefix_caching=False)  # fmt: skip
    core = llm.llm_engine.core
    # each step on whatever thread count its chooser measured faster: every count sums attention alike
    calls = []
    real = decode_rows.run_rows

    def spy(*args):
        out = real(*args)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(decode_rows, "run_rows", spy)
    prompt = demo_tok.encode("Copy this list exactly.\nred, green, blue, cyan, magenta, yellow, black, white\n"
                             "red, green, blue, cyan, magenta, yellow, black, white\nred, green,")
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    speculator = core.speculator
    with_spec = llm.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0].token_ids
    core.speculator = None
    without = llm.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0].token_ids
    core.speculator = speculator
    assert speculator.num_accepted_tokens > 0 and calls and all(calls)
    assert with_spec == without


def test_adaptive_k_backs_off_where_proposals_fail():
    from wslm.backend.spec_decode.adaptive import MAX_PAUSE, AdaptiveK, best_k

    assert best_k(0.99, 4) == 4 and best_k(0.3, 4) == 0  # k grows with the acceptance rate
    assert 0 < best_k(0.9, 8) < 8
    ak = AdaptiveK()
    assert ak.limit(1, 4) >= 3  # a new sequence tries (the prior: 95 percent accepted)
    tried = 0
    for _ in range(4 * MAX_PAUSE):  # its proposals keep failing: it stops proposing, and probes now and then,
        k = ak.limit(1, 4)           # less often while the probes fail
        if k:
            tried += 1
            ak.record(1, k, 0)
    assert 3 <= tried <= 12
    for _ in range(40):  # proposals that are all accepted bring it back to K
        k = ak.limit(1, 4)
        if k:
            ak.record(1, k, k)
    assert ak.limit(1, 4) == 4
    ak.forget(set())
    assert len(ak) == 0


def test_adaptive_k_follows_the_measured_cost_of_a_verification_row():
    from wslm.backend.spec_decode.adaptive import MAX_PAUSE, ROW_COST, AdaptiveK, best_k

    ak = AdaptiveK()
    ak.observe(5, 0.5)  # no plain step timed yet: nothing to compare with
    assert ak.row_cost == ROW_COST
    for _ in range(20):
        ak.observe(1, 0.010)
    ak.observe(5, 1.0)  # one odd step (a thread-count try, a page fault) moves it, but not far
    assert ak.row_cost < 0.7
    for _ in range(30):  # 4 extra rows cost 0.2 of a row together: speculating pays at a lower acceptance
        ak.observe(5, 0.012)
    assert ak.row_cost < 0.1 and best_k(0.6, 4, ak.row_cost) >= 2
    for _ in range(40):  # now each extra row costs a whole row (a busy machine): it does not pay
        ak.observe(5, 0.050)
    assert ak.row_cost > 0.9 and best_k(0.8, 4, ak.row_cost) == 0
    # Paused by that cost, a sequence still probes with one token now and then, so the cost is measured again.
    probes = sum(1 for _ in range(4 * MAX_PAUSE) if ak.limit(7, 4))
    assert probes >= 2
