"""The CPU fast decode path (wslm/backend/platforms/cpu/decode_eager.py) computes exactly what the general path does:
the same tokens, the same logprobs to the last bit and the same KV pool, alone and batched, for every
weight format and layer variant it takes; models it does not cover run the general path."""

from __future__ import annotations

import pytest
import torch
from test_modeling_families import make_family_model
from test_modeling_moe import make_moe_model

from wslm.backend import LLM, SamplingParams
from wslm.backend.platforms.cpu.decode_eager import ENV_VAR, why_not

PROMPTS = [
    "Hi",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a village by the sea, there lived an old clockmaker",
]


def _run(folder: str, tok, monkeypatch, fast: bool, **kw):
    monkeypatch.setenv("WSLM_CPU_NATIVE_DECODE", "0")  # lone sequences would run in C (test_cpu_native.py)
    monkeypatch.setenv(ENV_VAR, "1" if fast else "0")
    llm = LLM(folder, kv_cache_memory=16 << 20, block_size=8, max_model_len=256, **kw)
    runner = llm.llm_engine.executor.runner
    assert (runner.cpu_decode is not None) == fast, why_not(runner.model, runner.kv_pool)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=3)
    alone = llm.generate({"prompt_token_ids": tok.encode(PROMPTS[-1])}, params)
    batch = llm.generate([{"prompt_token_ids": tok.encode(p)} for p in PROMPTS], params)
    outs = [(o.token_ids, [{t: lp.logprob for t, lp in d.items()} for d in o.logprobs])
            for r in (*alone, *batch) for o in r.outputs]  # fmt: skip
    if fast:
        assert runner.cpu_decode.steps >= 2 * 19  # every decode step of both runs took it
    return outs, runner.kv_pool.clone()


def _same_as_general(folder, tok, monkeypatch, **kw) -> None:
    fast, fast_pool = _run(str(folder), tok, monkeypatch, True, **kw)
    slow, slow_pool = _run(str(folder), tok, monkeypatch, False, **kw)
    assert fast == slow
    assert torch.equal(fast_pool, slow_pool)


@pytest.mark.parametrize(
    "arch,kw",
    [
        ("llama", {"dtype": "float32"}),  # GQA, llama3 rope, dense
        ("qwen2", {"dtype": "float32"}),  # q/k/v biases, tied head
        ("llama", {"dtype": "bfloat16", "quantization": "int4"}),
        ("qwen2", {"dtype": "bfloat16", "quantization": "int8"}),  # int8 kernel with a bias
        # float32 (dtype=auto without bf16 arithmetic) over the bf16 int4/int8 kernels: converted per call
        ("llama", {"dtype": "float32", "quantization": "int4"}),
        ("qwen2", {"dtype": "float32", "quantization": "int8"}),
    ],
)
def test_fast_decode_matches_the_general_path(arch, kw, tiny_models, demo_tok, monkeypatch):
    _same_as_general(tiny_models[arch], demo_tok, monkeypatch, **kw)


def test_fast_decode_matches_with_qk_norm_and_experts(demo_tok, tmp_path, monkeypatch):
    folder, _ = make_family_model(tmp_path / "qwen3", "qwen3", demo_tok)  # per-head q/k RMSNorm
    _same_as_general(folder, demo_tok, monkeypatch, dtype="float32")
    folder, _ = make_moe_model(tmp_path / "moe", "qwen3_moe", demo_tok)  # the MoE block runs as is
    _same_as_general(folder, demo_tok, monkeypatch, dtype="float32")


def test_fast_decode_matches_on_the_demo_gguf_kept_quantized(demo_tok, monkeypatch):
    monkeypatch.setenv("WSLM_GGUF_DEQUANTIZE", "0")  # Q4_1 -> int4, Q8_0 -> int8, bf16 activations
    _same_as_general("demo", demo_tok, monkeypatch, dtype="bfloat16")


@pytest.mark.parametrize("family", ["phi3", "gemma2"])
def test_models_it_does_not_cover_take_the_general_path(family, demo_tok, tmp_path):
    folder, _ = make_family_model(tmp_path / family, family, demo_tok)
    llm = LLM(str(folder), kv_cache_memory=16 << 20, block_size=8, max_model_len=128, dtype="float32")
    runner = llm.llm_engine.executor.runner
    assert runner.cpu_decode is None
    reason = why_not(runner.model, runner.kv_pool)
    assert reason and ("rotary" in reason or "layer type" in reason or "window" in reason)
