"""The in-process and the multiprocess EngineCoreClient give the same tokens: greedy, seeded sampling, n > 1,
logprobs, stop strings, structured output; the core process goes away with shutdown(). A tiny Llama written by
the test, one LLMEngine of each kind."""

from __future__ import annotations

import psutil
import pytest
from hub_server import make_tiny_llama

from wslm.backend.config import EngineConfig
from wslm.backend.engine import core_client
from wslm.backend.frontend.llm_engine import LLMEngine
from wslm.backend.sampling_params import SamplingParams
from wslm.backend.structured.params import StructuredOutputsParams


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    folder = make_tiny_llama(tmp_path_factory.mktemp("tiny-client"))
    config = EngineConfig(model=str(folder), dtype="float32", device="cpu", kv_cache_memory=8 << 20,
                          enforce_eager=True)
    mp = LLMEngine(config, core_process=True)  # forked first: this process has run no model yet
    inproc = LLMEngine(config)
    yield inproc, mp
    mp.shutdown()


def _run(engine: LLMEngine, requests: list[tuple[str, str, SamplingParams]]) -> dict:
    for rid, prompt, params in requests:
        engine.add_request(rid, prompt, params)
    got: dict = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            for c in out.outputs:
                entry = got.setdefault((out.request_id, c.index), {"ids": [], "text": "", "lp": []})
                entry["ids"] += c.token_ids
                entry["text"] += c.text
                entry["lp"] += [round(d[t].logprob, 4) for t, d in zip(c.token_ids, c.logprobs or [])]
                if c.finish_reason:
                    entry["end"] = (c.finish_reason, c.stop_reason)
    return got


def test_in_process_and_core_process_give_identical_outputs(engines):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    requests = [
        ("greedy", "hello there", SamplingParams(max_tokens=24, temperature=0, logprobs=2)),
        ("seeded", "once upon", SamplingParams(max_tokens=24, temperature=0.9, seed=7, n=3)),
        ("stops", "the the the", SamplingParams(max_tokens=40, temperature=0.8, seed=1, stop=["e"],
                                                 stop_token_ids=[5], min_tokens=2)),
        ("json", "data:", SamplingParams(max_tokens=30, temperature=0,
                                         structured_outputs=StructuredOutputsParams(json=schema))),
    ]
    inproc, mp = engines
    a, b = _run(inproc, requests), _run(mp, requests)
    assert a == b
    assert len(a) == 6 and all("end" in v for v in a.values())
    assert inproc.get_stats()["num_free_blocks"] == inproc.get_stats()["num_blocks"]
    assert mp.get_stats()["num_free_blocks"] == mp.get_stats()["num_blocks"]  # the core freed every block


def test_after_a_model_ran_here_core_processes_start_by_spawn(engines):
    # OpenMP's threads do not survive a fork: a forked core would hang in its first parallel region.
    assert core_client.safe_start_method("fork") == "spawn"


def test_abort_reaches_the_core_process_and_shutdown_leaves_no_process(engines):
    _, mp = engines
    mp.add_request("long", "abc", SamplingParams(max_tokens=200, ignore_eos=True))
    mp.step()
    mp.abort_request("long")
    outs = mp.step()
    assert [o.outputs[0].finish_reason for o in outs if o.request_id == "long"] == ["abort"]
    assert not mp.has_unfinished_requests()
    proc = mp.client.proc
    assert psutil.pid_exists(proc.pid)
    mp.shutdown()
    assert proc.exitcode == 0
