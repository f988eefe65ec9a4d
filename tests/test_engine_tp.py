"""Tensor parallelism on CPU (gloo): N worker processes give the same greedy tokens as one process."""

from __future__ import annotations

import os
import signal
import threading

import psutil
import pytest

from wslm.backend import LLM, SamplingParams
from wslm.backend.distributed.executor import EngineDeadError

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "1 2 3",
]
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


def _tokens(llm: LLM, prompts=PROMPTS, params=GREEDY) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def _children() -> list[psutil.Process]:
    """Live child processes, less multiprocessing's own resource tracker (one per parent, not a worker)."""
    alive = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(p.cmdline()):
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def _engine_kwargs(**extra):
    extra.setdefault("max_model_len", 256)
    return dict(dtype="float32", kv_cache_memory=32 << 20, **extra)


@pytest.fixture(scope="module")
def reference(tiny_models):
    """TP=1 greedy tokens for each tiny model (and the demo model), computed once."""
    out = {}
    for arch in ("llama", "qwen2"):
        llm = LLM(str(tiny_models[arch]), **_engine_kwargs())
        out[arch] = _tokens(llm)
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # GQA with 2 KV heads split; 1 KV head replicated
def test_tp2_matches_tp1_with_chunking_prefix_cache_and_preemption(tiny_models, reference, arch):
    # A 24-token budget forces chunked prefill; 8 blocks of 16 tokens force preemption with 4 sequences
    # of up to ~40 tokens; the repeated prompt list hits the prefix cache on the second call.
    llm = LLM(str(tiny_models[arch]), tensor_parallel_size=2, max_num_batched_tokens=24,
              num_gpu_blocks_override=8, **_engine_kwargs(max_model_len=128))  # fmt: skip
    try:
        assert _tokens(llm) == reference[arch]
        again = llm.generate(PROMPTS, GREEDY)
        assert [o.outputs[0].token_ids for o in again] == reference[arch]
        assert any(o.num_cached_tokens > 0 for o in again)
        assert llm.llm_engine.scheduler.num_preemptions > 0
        # Abort mid-run: blocks come back, the engine keeps serving.
        engine = llm.llm_engine
        engine.add_request("gone", PROMPTS[2], SamplingParams(max_tokens=50))
        engine.step()
        engine.abort_request("gone")
        while engine.has_unfinished_requests():
            engine.step()
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
        assert _tokens(llm, PROMPTS[:1]) == reference[arch][:1]
    finally:
        llm.llm_engine.shutdown()
    assert not _children()


def test_demo_model_tp3_matches_tp1(demo_llm):
    # The demo model has 9 attention heads and 3 KV heads: 3 ranks divide it, 2 do not (see below).
    expected = _tokens(demo_llm)
    llm = LLM("demo", tensor_parallel_size=3, **_engine_kwargs())
    try:
        assert _tokens(llm) == expected
    finally:
        llm.llm_engine.shutdown()
    assert not _children()


def test_size_that_does_not_divide_the_heads_fails_before_any_worker_starts():
    with pytest.raises(ValueError, match=r"does not divide this model evenly \(9 attention heads.* 1 or 3\."):
        LLM("demo", tensor_parallel_size=2, **_engine_kwargs())
    assert not _children()


def test_killed_worker_stops_the_engine_with_a_clear_error_and_no_orphans(tiny_models):
    llm = LLM(str(tiny_models["llama"]), tensor_parallel_size=2, **_engine_kwargs())
    engine = llm.llm_engine
    pids = engine.runner.pids
    assert len(_children()) >= 2
    killer = threading.Timer(0.5, os.kill, args=(pids[1], signal.SIGKILL))
    killer.start()
    with pytest.raises(EngineDeadError, match=r"rank 1 \(pid \d+\)"):
        llm.generate(PROMPTS * 8, SamplingParams(max_tokens=200, ignore_eos=True))
    killer.join()
    with pytest.raises(EngineDeadError):
        engine.check_health()
    assert not _children()


def test_ray_backend_matches_tp1(tiny_models, reference):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        llm = LLM(str(tiny_models["llama"]), tensor_parallel_size=2, distributed_executor_backend="ray",
                  **_engine_kwargs())  # fmt: skip
        try:
            assert _tokens(llm) == reference["llama"]
        finally:
            llm.llm_engine.shutdown()
    finally:
        ray.shutdown()


def test_ray_backend_names_the_missing_resources(tiny_models):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        with pytest.raises(ValueError, match="needs 2 CPUs in the Ray cluster, which has 1"):
            LLM(str(tiny_models["llama"]), tensor_parallel_size=2, distributed_executor_backend="ray",
                **_engine_kwargs())  # fmt: skip
    finally:
        ray.shutdown()


def test_serve_tp2_answers_the_openai_client_and_stops_every_worker(tiny_models):
    import openai
    from test_server_helpers import SMALL, ServerProcess

    srv = ServerProcess("--port", "0", "--model", str(tiny_models["llama"]), "--tensor-parallel-size", "2",
                        "--dtype", "float32", *SMALL[:2], "--max-model-len", "256")  # fmt: skip
    try:
        workers = [w for w in psutil.Process(srv.proc.pid).children(recursive=True)
                   if "resource_tracker" not in " ".join(w.cmdline())]  # fmt: skip
        assert len(workers) == 2
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=120)
        model = client.models.list().data[0].id
        out = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=16, temperature=0)
        stream = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=16, temperature=0,
                                           stream=True)  # fmt: skip
        streamed = "".join(c.choices[0].text for c in stream if c.choices)
        assert streamed == out.choices[0].text and out.usage.completion_tokens > 0
    finally:
        assert srv.stop() == 0, srv.stderr()[-3000:]
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive
