"""--kv-cache-dtype fp8 (vLLM's name; e4m3): the pool holds one byte per value, so the same memory holds
twice the tokens, and the engine's output stays that of the model-dtype cache."""

import argparse

import pytest
import torch

from wslm.backend import LLM, SamplingParams
from wslm.backend.config import EngineConfig

CHAT = [{"role": "user", "content": "Write a short story about a lighthouse keeper and a storm."}]


def test_fp8_pool_holds_more_tokens_and_keeps_the_output(demo_llm):
    """Against the session's demo engine (float32 cache; same weights, dtype and kernels otherwise)."""
    fp8 = LLM("demo", dtype="float32", kv_cache_memory=32 << 20, max_model_len=512, kv_cache_dtype="fp8")
    engine = fp8.llm_engine
    assert engine.executor.runner.kv_pool.dtype == torch.float8_e4m3fn
    mc = engine.model_config
    assert mc.kv_bytes_per_token() * 4 == mc.kv_bytes_per_token(torch.float32)  # 1 byte a value, not 4
    assert engine.block_manager.num_blocks * mc.kv_bytes_per_token() * 16 <= 32 << 20
    assert engine.block_manager.num_blocks >= 0.9 * (32 << 20) // (mc.kv_bytes_per_token() * 16)
    prompt = demo_llm.llm_engine.apply_chat_template(CHAT, None, True)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    want = list(demo_llm.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0].token_ids)
    # Teacher-forced: the fp8 engine's next token after each reference prefix (decode over a cached prefix).
    one = SamplingParams(temperature=0, max_tokens=1)
    got = [fp8.generate([{"prompt_token_ids": prompt + want[:i]}], one)[0].outputs[0].token_ids[0]
           for i in range(len(want))]  # fmt: skip
    assert sum(a == b for a, b in zip(got, want)) / len(want) >= 0.9
    # Plain decode over the fp8 cache, one query per step.
    text = fp8.chat(CHAT, SamplingParams(temperature=0, max_tokens=16))[0].outputs[0].text
    assert len(text.split()) >= 5


def test_kv_cache_dtype_values_and_flag():
    with pytest.raises(ValueError, match="e5m2 is not supported"):
        EngineConfig(kv_cache_dtype="fp8_e5m2")
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, fp8, fp8_e4m3"):
        EngineConfig(kv_cache_dtype="int8")
    from wslm.backend.entrypoints.cli import serve as serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--kv-cache-dtype", "fp8"])
    from wslm.backend.entrypoints.openai.launcher import engine_config

    assert engine_config(args).kv_cache_dtype == "fp8"


def test_triton_kernels_compile_for_an_fp8_cache_on_ada():
    pytest.importorskip("triton")
    """No GPU here: the CUDA path is checked by compiling its cache-write and decode kernels with e4m3
    cache pointers for sm_89 (Triton's interpreter has no fp8). Older GPUs lack e4m3 (the engine refuses
    them with a clear error, kv_cache.kv_cache_torch_dtype)."""
    import dataclasses

    import kernel_compile as cc

    fp8 = (("k_cache_ptr", "fp8e4nv"), ("v_cache_ptr", "fp8e4nv"))
    launches = cc._attention_launches("bfloat16", (8, 9), 64, 3, 16, False)
    launches += cc._small_launches("bfloat16", (8, 9), (9, 3, 64, 576), 16, True)
    wanted = [dataclasses.replace(x, pointer_types=x.pointer_types + fp8) for x in launches
              if x.kernel.endswith(("_decode_kernel", "_reshape_and_cache_kernel"))]  # fmt: skip
    # Worker processes: this one runs Triton's interpreter (conftest), which cannot compile.
    results = cc.compile_all(wanted, jobs=2)
    assert len(results) == 2 and all(not r.problems() for r in results), [r.problems() for r in results]
