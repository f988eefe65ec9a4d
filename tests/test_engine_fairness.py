"""One request must not starve the others: while a long prompt and a wide fan-out (n=32) are admitted,
every running stream still gains one token in every engine step, each step's prefill work stays within
long_prefill_token_threshold, and the fan-out joins at most fanout_per_step sequences per step. Counted in
steps, not timed."""

from __future__ import annotations

import pytest
from hub_server import make_tiny_llama

from wslm.backend.config import EngineConfig
from wslm.backend.frontend.llm_engine import LLMEngine
from wslm.backend.sampling_params import SamplingParams

THRESHOLD = 32
FANOUT = 4


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> LLMEngine:
    folder = make_tiny_llama(tmp_path_factory.mktemp("tiny-fair"))
    config = EngineConfig(model=str(folder), dtype="float32", device="cpu", kv_cache_memory=8 << 20,
                          max_num_batched_tokens=256, long_prefill_token_threshold=THRESHOLD,
                          fanout_per_step=FANOUT, max_num_seqs=64)
    return LLMEngine(config)


def _record_schedules(engine: LLMEngine) -> list:
    steps = []
    original = engine.scheduler.schedule

    def schedule():
        out = original()
        steps.append([(seq.request_id, n, n == 1 and seq.num_computed_tokens + 1 == seq.num_tokens)
                      for seq, n in out.scheduled])
        return out

    engine.scheduler.schedule = schedule
    return steps


def test_streams_keep_one_token_per_step_during_long_prefill_and_fanout(engine):
    streams = [f"stream-{i}" for i in range(4)]
    for i, rid in enumerate(streams):
        engine.add_request(rid, list(range(5 + i, 15 + i)), SamplingParams(temperature=0, max_tokens=60,
                                                                            ignore_eos=True))
    for _ in range(3):  # all four are decoding now
        engine.step()
    steps = _record_schedules(engine)
    engine.add_request("long", list(range(3, 203)), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    engine.add_request("fan", list(range(7, 47)), SamplingParams(n=32, temperature=0.8, seed=1, max_tokens=8,
                                                                 ignore_eos=True))
    gained: dict[str, list[int]] = {rid: [] for rid in streams}
    finished: dict[str, list] = {}
    fan_done: set[int] = set()
    while engine.has_unfinished_requests():
        outputs = engine.step()
        for out in outputs:
            fan_done |= {c.index for c in out.outputs if out.request_id == "fan" and c.finish_reason}
            if out.request_id in gained and not out.finished:
                gained[out.request_id].append(sum(len(c.token_ids) for c in out.outputs))
            if out.finished:
                finished[out.request_id] = out
        if all(rid in finished for rid in streams):
            break
    while engine.has_unfinished_requests():
        for out in engine.step():
            fan_done |= {c.index for c in out.outputs if out.request_id == "fan" and c.finish_reason}

    # Every stream gained exactly one token in every step until it finished (57 steps after the warm-up).
    for rid in streams:
        assert gained[rid] == [1] * len(gained[rid]) and len(gained[rid]) == 60 - 3 - 1, (rid, gained[rid])
    # The long prompt went in chunks within the threshold while the streams were decoding...
    long_chunks = [n for step in steps for rid, n, _ in step if rid == "long" and n > 1]
    assert sum(long_chunks) == 200 and max(long_chunks) <= THRESHOLD and len(long_chunks) >= 200 // THRESHOLD
    for step in steps:
        decodes = sum(1 for _, n, is_decode in step if is_decode)
        prefill = sum(n for _, n, is_decode in step if not is_decode)
        if decodes:
            assert prefill <= THRESHOLD, step
    # ...and the fan-out joined a few sequences per step, all 32 of them finishing.
    per_step = [sum(1 for rid, n, is_decode in step if rid == "fan" and not is_decode) for step in steps]
    assert max(per_step) <= FANOUT and sum(1 for c in per_step if c) >= 32 // FANOUT
    assert fan_done == set(range(32))
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks  # nothing leaked
