"""Faults inside the engine, on a real (tiny) engine: out of memory while running a step (injected by
tests/fault_executor.py, as a real allocation would raise) makes the engine shrink its steps and go on, or
fail only that request with a message naming the cause; aborts while waiting, during a chunked prefill,
after a preemption and with pending n>1 forks leak no KV block."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from fault_executor import BACKEND, Faults
from hub_server import make_tiny_llama

from wslm.backend.config import EngineConfig
from wslm.backend.errors import ErrorKind
from wslm.backend.frontend.llm_engine import LLMEngine
from wslm.backend.outputs import OUT_OF_MEMORY_ERROR, RequestOutput
from wslm.backend.sampling_params import SamplingParams
from wslm.backend.sequence import SequenceStatus

PROMPT = list(range(3, 43))  # 40 tokens


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> LLMEngine:
    folder = make_tiny_llama(tmp_path_factory.mktemp("tiny-faults"))
    # 16 blocks of 16 tokens: three 140-token sequences cannot all fit, so preemption happens.
    config = EngineConfig(model=str(folder), dtype="float32", device="cpu", num_gpu_blocks_override=16,
                          max_num_batched_tokens=128, max_num_seqs=16, distributed_executor_backend=BACKEND)
    return LLMEngine(config)


def _run(engine: LLMEngine) -> dict:
    """Runs everything queued; the final output of each request, with .tokens: its first completion's ids."""
    done, tokens = {}, {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(t for c in out.outputs if c.index == 0 for t in c.token_ids)
            if out.finished:
                done[out.request_id] = out
    return {rid: Done(out, tokens.get(rid, [])) for rid, out in done.items()}


@dataclass
class Done:
    out: RequestOutput
    tokens: list[int]


def _reset(engine: LLMEngine) -> None:
    engine.executor.faults = None
    sched = engine.scheduler
    sched.max_num_batched_tokens, sched.max_num_seqs = sched.configured
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks, "leaked KV blocks"


def _greedy(max_tokens: int = 12) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def test_oom_shrinks_the_steps_and_the_answer_is_unchanged(engine, caplog):
    engine.add_request("ref", PROMPT, _greedy())
    reference = _run(engine)["ref"].tokens
    engine.executor.faults = Faults(oom_above_tokens=8)  # any step over 8 tokens "runs out of memory"
    engine.add_request("a", PROMPT, _greedy())
    engine.add_request("b", PROMPT[:20], _greedy())
    done = _run(engine)
    assert done["a"].tokens == reference and done["a"].out.error is None
    assert done["b"].out.outputs[0].finish_reason == "length"
    assert engine.scheduler.max_num_batched_tokens <= 8  # shrunk...
    assert "Out of memory" in caplog.text and "continuing with at most" in caplog.text
    engine.executor.faults = None
    engine.add_request("c", PROMPT, _greedy(max_tokens=100))
    assert _run(engine)["c"].tokens[:12] == reference
    assert engine.scheduler.max_num_batched_tokens > 8  # ...and grown back after a run of good steps
    _reset(engine)


def test_oom_on_the_smallest_step_fails_only_that_request(engine):
    engine.executor.faults = Faults(oom_above_tokens=0)
    engine.add_request("doomed", PROMPT, _greedy())
    done = _run(engine)["doomed"].out
    assert done.error.startswith(OUT_OF_MEMORY_ERROR) and "--max-num-seqs" in done.error
    assert done.error_kind is ErrorKind.OUT_OF_MEMORY
    assert done.outputs[0].finish_reason == "error"
    _reset(engine)
    engine.add_request("after", PROMPT, _greedy())
    assert _run(engine)["after"].out.outputs[0].finish_reason == "length"  # the engine went on
    _reset(engine)


def test_abort_while_waiting_during_prefill_and_after_preemption(engine):
    bm = engine.block_manager
    # While waiting: never scheduled.
    engine.add_request("w", PROMPT, _greedy())
    engine.abort_request("w")
    assert [o.outputs[0].finish_reason for o in engine.step()] == ["abort"]
    _reset(engine)
    # During a chunked prefill: a 200-token prompt with a 32-token budget is mid-prompt after one step.
    engine.scheduler.max_num_batched_tokens = 32
    engine.add_request("p", list(range(3, 203)), _greedy(4))
    engine.step()
    seq = engine.requests["p"].seqs[0]
    assert 0 < seq.num_computed_tokens < 200 and seq.block_table
    engine.abort_request("p")
    engine.step()
    _reset(engine)
    # After a preemption: three 140-token sequences in a 256-token pool.
    for rid in ("x", "y", "z"):
        engine.add_request(rid, PROMPT, _greedy(100))
    preempted = None
    for _ in range(200):
        engine.step()
        preempted = next((s for r in engine.requests.values() for s in r.seqs
                          if s.num_preemptions and s.status is SequenceStatus.WAITING), None)
        if preempted is not None:
            break
    assert preempted is not None and engine.scheduler.num_preemptions > 0
    assert bm.num_free_blocks < bm.num_blocks
    engine.abort_request(preempted.request_id)
    engine.step()
    # n > 1 with forks still pending, and everything else, aborted mid-flight.
    engine.add_request("fan", PROMPT, SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=20))
    engine.step()
    engine.step()
    engine.abort_request(list(engine.requests))
    engine.step()
    assert not engine.has_unfinished_requests()
    _reset(engine)
