"""One worker path: the single-device executor runs every step as the tensor-parallel ones do, through one
Worker (rank 0 of 1): one Worker.execute_step and one ModelRunner.execute(StepInputs) per engine step, decode
steps offered to the CPU decode plan from there, and a grammar applied as the bitmask rows the executor filled
(the sampler's one grammar path). Counted on a real engine (a tiny Llama written by the test)."""

from __future__ import annotations

from collections import Counter

import pytest
from hub_server import make_tiny_llama

from wslm.backend.config import EngineConfig
from wslm.backend.engine.step_inputs import SamplingBatch, StepInputs
from wslm.backend.frontend.llm_engine import LLMEngine
from wslm.backend.sampling_params import SamplingParams, StructuredOutputsParams
from wslm.backend.worker.model_runner import ModelRunner
from wslm.backend.worker.worker import Worker


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = make_tiny_llama(tmp_path_factory.mktemp("tiny-worker-path"))
    return LLMEngine(EngineConfig(model=str(folder), dtype="float32", device="cpu", kv_cache_memory=8 << 20))


def _run(engine) -> tuple[dict, dict]:
    """Step until idle: each completion's token ids and text, by (request id, index) (outputs are deltas)."""
    tokens: dict = {}
    text: dict = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            for c in out.outputs:
                tokens.setdefault((out.request_id, c.index), []).extend(c.token_ids)
                text[(out.request_id, c.index)] = text.get((out.request_id, c.index), "") + c.text
    return tokens, text


def test_every_step_goes_through_the_worker_and_the_one_runner_entry(engine, monkeypatch):
    executor = engine.executor
    assert isinstance(executor.worker, Worker) and (executor.worker.rank, executor.worker.size) == (0, 1)
    counts: Counter = Counter()
    seen: list[tuple[StepInputs, SamplingBatch | None]] = []

    def count(owner, name: str, record=None):
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            counts[name] += 1
            if record is not None:
                record(*args, **kwargs)
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    count(Worker, "execute_step", lambda self, step, batch=None: seen.append((step, batch)))
    count(ModelRunner, "execute")
    plan = executor.runner.cpu_plan
    if plan is not None:
        count(plan, "run")
    count(executor.worker.sampler.grammar_masker, "apply_bitmask")

    regex = StructuredOutputsParams(regex="[ab]{6}")
    engine.add_request("g", "hello", SamplingParams(max_tokens=6, structured_outputs=regex, temperature=0))
    engine.add_request("s", "hello", SamplingParams(max_tokens=6, temperature=0.8, seed=3, n=2, ignore_eos=True))
    tokens, text = _run(engine)
    assert counts["execute_step"] == counts["execute"] == len(seen) > 0
    assert all(isinstance(step, StepInputs) and isinstance(batch, SamplingBatch) for step, batch in seen)
    decode_steps = sum(1 for step, _ in seen if step.max_seqlen_q == 1)
    assert decode_steps and (plan is None or counts["run"] == decode_steps)
    # The grammar's rows, filled by the executor, reached the sampler in every step that sampled "g".
    assert counts["apply_bitmask"] == sum(1 for _, b in seen if b.bitmask is not None) > 0
    assert text[("g", 0)] and set(text[("g", 0)]) <= {"a", "b"}
    assert len(tokens[("s", 0)]) == len(tokens[("s", 1)]) == 6


def test_seeded_sampling_repeats_across_runs(engine):
    """A seeded request's generator lives with the sampling worker, by sequence id: the same seed gives the
    same tokens in a later request, whatever else shares the batch."""
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=11, ignore_eos=True)

    def run(extra: bool) -> list[int]:
        engine.add_request("a", "once upon", params)
        if extra:
            engine.add_request("b", "a time", SamplingParams(max_tokens=8, temperature=1.0, ignore_eos=True))
        return _run(engine)[0][("a", 0)]

    first = run(False)
    assert run(True) == first and len(first) == 8
