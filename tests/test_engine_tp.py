"""Tensor parallelism on CPU (gloo): N worker processes give the same greedy tokens as one process."""

from __future__ import annotations

import logging
import os
import re
import signal
import threading

import psutil
import pytest

from wslm.backend import LLM, SamplingParams
from wslm.backend.errors import EngineDeadError

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "1 2 3",
]
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


def _tokens(llm: LLM, prompts=PROMPTS, params=GREEDY) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def _children(wait: float = 20.0) -> list[psutil.Process]:
    """Live child processes, less multiprocessing's own resource tracker (one per parent, not a worker),
    waiting up to `wait` seconds for exiting ones to go (a worker told to stop takes a moment on a busy
    machine)."""
    import time

    deadline = time.monotonic() + wait
    while True:
        alive = []
        for p in psutil.Process().children(recursive=True):
            try:
                if p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(p.cmdline()):
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.2)


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


def test_rank0_samples_so_only_token_ids_cross_the_pipe(tiny_models, monkeypatch):
    """Sampling runs on rank 0's worker: seeded sampling with n > 1, penalties, logprobs and a grammar
    gives TP=1's tokens, and what comes back over the pipe each step is token ids and the logprobs asked
    for (bytes), never a logits row (vocabulary x 4 bytes)."""
    from multiprocessing.connection import Connection

    from wslm.backend.structured import StructuredOutputsParams

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    params = [SamplingParams(max_tokens=10, temperature=0.9, seed=7, n=2, logprobs=2, presence_penalty=0.4),
              SamplingParams(max_tokens=12, temperature=0.0, structured_outputs=StructuredOutputsParams(json=schema))]
    prompts = PROMPTS[:2]

    def run(llm):
        return [[(c.token_ids, [sorted(lp) for lp in c.logprobs or []]) for c in o.outputs]
                for o in llm.generate(prompts, params)]

    expected = run(LLM(str(tiny_models["llama"]), **_engine_kwargs()))
    llm = LLM(str(tiny_models["llama"]), tensor_parallel_size=2, **_engine_kwargs())
    sizes: list[int] = []
    recv = Connection._recv_bytes

    def counting(self, maxsize=None):
        buf = recv(self, maxsize)
        sizes.append(buf.getbuffer().nbytes)
        return buf

    try:
        monkeypatch.setattr(Connection, "_recv_bytes", counting)
        assert run(llm) == expected
        monkeypatch.undo()
        row_bytes = 4 * llm.llm_engine.model_config.vocab_size
        assert sizes and max(sizes) < 4096 < row_bytes
    finally:
        llm.llm_engine.shutdown()


def test_demo_model_tp3_matches_tp1(demo_llm, caplog):
    # The demo model has 9 attention heads and 3 KV heads: 3 ranks divide it, 2 do not (see below).
    expected = _tokens(demo_llm)
    with caplog.at_level(logging.INFO, logger="wslm"):
        llm = LLM("demo", tensor_parallel_size=3, **_engine_kwargs())
    try:
        # The start log gives the pool's token capacity and what each rank holds.
        assert re.search(r"KV cache: (\d+) blocks of 16 tokens = \d+ tokens \([\d.]+ GiB per rank; each of 3 ranks "
                         r"holds these \1 blocks for its 1 of 3 KV heads\)", caplog.text), caplog.text[-2000:]
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
    pids = engine.executor.pids
    assert len(_children(wait=0)) >= 2
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
        assert len(workers) == 3  # the model's engine core process (engine/core_proc.py) and its two ranks
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


# ---- MoE and quantized weights split across ranks ---------------------------------------------------


def _make_moe(folder, family: str, tok):
    """8 experts, top-2, 2 layers; 4 heads and 2 KV heads so 2 ranks divide it (Qwen2-MoE: a shared expert)."""
    import torch
    import transformers as tf

    torch.manual_seed(3)
    common = dict(
        vocab_size=len(tok), hidden_size=64, intermediate_size=64, moe_intermediate_size=32, num_experts=8,
        num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, initializer_range=0.2, tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
    )  # fmt: skip
    if family == "qwen3_moe":
        model = tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(head_dim=16, norm_topk_prob=True, **common))
    else:
        model = tf.Qwen2MoeForCausalLM(tf.Qwen2MoeConfig(shared_expert_intermediate_size=40, **common))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _assert_half_per_rank(tp1: dict, ranks: list[dict]) -> None:
    """Each of 2 ranks holds half of the decoder layers' and of the vocabulary's weight bytes (norms and
    routers, replicated, are a few percent)."""
    for part in ("layers", "vocab"):
        for r in ranks:
            assert 0.48 <= r[part] / tp1[part] <= 0.53, (part, r[part], tp1[part])


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
def test_moe_tp2_splits_every_expert_and_matches_tp1(tmp_path, demo_tok, family):
    from wslm.backend.modeling.weight_bytes import weight_bytes

    folder = str(_make_moe(tmp_path / family, family, demo_tok))
    one = LLM(folder, **_engine_kwargs())
    expected, tp1_bytes = _tokens(one), weight_bytes(one.llm_engine.executor.runner.model)
    llm = LLM(folder, tensor_parallel_size=2, **_engine_kwargs())
    try:
        assert _tokens(llm) == expected
        _assert_half_per_rank(tp1_bytes, llm.llm_engine.executor._call_all("weight_bytes"))
    finally:
        llm.llm_engine.shutdown()
    assert not _children()


@pytest.fixture(scope="module")
def awq_model(tiny_models, tmp_path_factory):
    from test_quant_awq_gptq import _make_checkpoint

    folder = tmp_path_factory.mktemp("awq") / "awq"
    _make_checkpoint(tiny_models["llama"], folder, "awq")
    return str(folder)


@pytest.mark.parametrize("quant", ["awq", "int8"])
def test_quantized_tp2_greedy_matches_tp1_in_float32(monkeypatch, tiny_models, awq_model, quant):
    # WSLM_QUANT_FLOAT32=1 keeps the quantized kernels in float32 (their default is bf16, which rounds each
    # rank's partial sum of o/down before the all-reduce and can flip a near-tie among 49k random logits);
    # set before the engines start, so the spawned workers inherit it.
    from wslm.backend.modeling.weight_bytes import weight_bytes

    monkeypatch.setenv("WSLM_QUANT_FLOAT32", "1")
    path, extra = (awq_model, {}) if quant == "awq" else (str(tiny_models["llama"]), {"quantization": "int8"})
    one = LLM(path, **_engine_kwargs(**extra))
    expected, tp1_bytes = _tokens(one), weight_bytes(one.llm_engine.executor.runner.model)
    llm = LLM(path, tensor_parallel_size=2, **_engine_kwargs(**extra))
    try:
        _assert_half_per_rank(tp1_bytes, llm.llm_engine.executor._call_all("weight_bytes"))  # quantized, not dense
        assert _tokens(llm) == expected
    finally:
        llm.llm_engine.shutdown()
    assert not _children()


def test_a_size_that_splits_4bit_groups_fails_before_any_worker_starts(awq_model):
    # 4 ranks would leave each 16 of o_proj's 64 input columns: half a group of 32.
    with pytest.raises(ValueError, match=r"split this checkpoint's 4-bit groups of 32 columns .* Use "
                                         r"--tensor-parallel-size 1 or 2, or a checkpoint with smaller groups"):
        LLM(awq_model, tensor_parallel_size=4, **_engine_kwargs())
    assert not _children()


def _load_as_rank(monkeypatch, path: str, quantization: str | None, rank: int, size: int, tokenizer=None):
    """The model one rank would load (no process group needed to load)."""
    import torch

    from wslm.backend.distributed import parallel_state
    from wslm.backend.loader.model_loader import load_model_config, load_tokenizer, resolve_model
    from wslm.backend.worker.model_runner import load_model

    source = resolve_model(path, None, None)
    _, mc = load_model_config(source, load_tokenizer(source, tokenizer, False), "float32", torch.device("cpu"),
                              False, quantization)  # fmt: skip
    monkeypatch.setattr(parallel_state._TP, "rank", rank)
    monkeypatch.setattr(parallel_state._TP, "size", size)
    try:
        return load_model(source, mc, torch.device("cpu"))
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("quant", ["awq", "int8"])
def test_quantized_shards_are_the_single_device_weights_sliced(monkeypatch, tiny_models, awq_model, quant):
    """Column-parallel rows and row-parallel input columns of each rank, dequantized, are exactly the
    single-device weight's slices: scales, zeros and groups went with them. (int4 on the fly sizes its
    groups to a rank's input width, so on these 64-wide layers TP=2 uses groups of 32 where TP=1 uses 64.)"""
    import torch

    path, q = (awq_model, None) if quant == "awq" else (str(tiny_models["llama"]), quant)
    full, *ranks = (_load_as_rank(monkeypatch, path, q, r, n) for r, n in ((0, 1), (0, 2), (1, 2)))

    def dense(w):
        assert not isinstance(w, torch.Tensor)  # kept quantized on every rank
        return w.dequantize(torch.float32)

    for i, layer in enumerate(full.layers):
        o, down = dense(layer.self_attn.o_proj.weight), dense(layer.mlp.down_proj.weight)
        gate, up = dense(layer.mlp.gate_up_proj.weight).chunk(2)
        for r, model in enumerate(ranks):
            shard = model.layers[i]
            assert torch.equal(dense(shard.self_attn.o_proj.weight), o.chunk(2, dim=1)[r])
            assert torch.equal(dense(shard.mlp.down_proj.weight), down.chunk(2, dim=1)[r])
            assert torch.equal(dense(shard.mlp.gate_up_proj.weight), torch.cat([gate.chunk(2)[r], up.chunk(2)[r]]))


def test_a_group_split_across_ranks_is_refused_and_act_order_goes_int8():
    import torch

    from wslm.backend.quant.int4 import quantize_int4_codes
    from wslm.backend.quant.int8 import Int8Weight
    from wslm.backend.quant.shard import narrow

    codes = quantize_int4_codes(torch.randn(16, 192), 64)
    with pytest.raises(ValueError, match=r"shards of 96, which its quantization groups of 64 columns do not"):
        narrow(codes, 1, 96, 96)
    torch.testing.assert_close(narrow(codes, 1, 64, 64).dequantize(), codes.dequantize()[:, 64:128], rtol=0, atol=0)
    codes.perm = torch.randperm(192)  # act-order GPTQ: the shard's columns are spread over every group
    part = narrow(codes, 1, 64, 64)
    assert isinstance(part, Int8Weight)
    ref = codes.dequantize()[:, 64:128]
    torch.testing.assert_close(part.dequantize(), ref, rtol=0, atol=ref.abs().max().item() / 127)
