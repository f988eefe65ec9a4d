"""Without the C kernels (WSLM_CPU_KERNELS=0, or no C compiler on PATH, as on a fresh WSL Ubuntu) CPU
decoding runs on torch's kernels: a tiny engine gives the same greedy tokens as with them, and its start-up
log says once, plainly, that the fast CPU path is off and why. Where the int4 kernel rounds the activation
row to int8 (as llama.cpp does; AVX2 or AVX512-VNNI CPUs) the two paths may part on a near tie, which a
tiny random model meets within a few tokens: there the demo GGUF's torch path must pick the C path's token
at almost every step given the same prefix."""

from __future__ import annotations

import pytest
from test_quant_engine import CHAT, _teacher_forced_agreement

from wslm.backend import LLM, SamplingParams
from wslm.kernels import cpu_gemv

PROMPT = "Once upon a time, in a village by the sea, there lived an old clockmaker"
OFF_LINE = "Fast CPU path off: "


@pytest.fixture
def retry(monkeypatch):
    """Makes the next engine try the library afresh (it is tried once a process); restored afterwards."""

    def again() -> None:
        monkeypatch.setattr(cpu_gemv, "_tried", False)
        monkeypatch.setattr(cpu_gemv, "_lib", None)
        monkeypatch.setattr(cpu_gemv, "_why", None)

    return again


def _greedy(folder, quantization, prompt: list[int]) -> tuple[list[int], object, LLM]:
    llm = LLM(str(folder), dtype="float32", quantization=quantization, kv_cache_memory=16 << 20, block_size=8,
              max_model_len=256, enforce_eager=True)  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": prompt}], params)
    return list(out[0].outputs[0].token_ids), llm.llm_engine.executor.runner, llm


@pytest.mark.parametrize("quantization", [None, "int4", "int8"])  # int4: where it computes torch's math
def test_without_the_c_kernels_the_greedy_tokens_are_the_same(
    quantization, tiny_models, demo_tok, monkeypatch, retry, caplog, tmp_path
):
    prompt = demo_tok.encode(PROMPT)
    retry()
    fast, runner, _ = _greedy(tiny_models["llama"], quantization, prompt)  # the C kernels, where they build
    if cpu_gemv.library() is not None:
        assert runner.native is not None  # so the runs below really change path
    if quantization == "int4" and cpu_gemv.int4_q8():
        pytest.skip("the int4 kernel rounds the row to int8 here: test_the_demo_gguf_agrees_without_them")

    monkeypatch.setenv(cpu_gemv.ENV_VAR, "0")
    retry()
    with caplog.at_level("INFO", logger="wslm.engine"):
        off, runner, _ = _greedy(tiny_models["llama"], quantization, prompt)
    assert runner.native is None
    assert off == fast
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(OFF_LINE)]
    assert lines == [f"{OFF_LINE}{cpu_gemv.ENV_VAR}=0 turns the C kernels off; torch's slower kernels run instead"]

    monkeypatch.delenv(cpu_gemv.ENV_VAR)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no cc, gcc nor clang
    retry()
    caplog.clear()
    with caplog.at_level("INFO", logger="wslm.engine"):
        no_cc, runner, _ = _greedy(tiny_models["llama"], quantization, prompt)
    assert runner.native is None and no_cc == off  # the same torch kernels as with the switch off
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(OFF_LINE)]
    assert len(lines) == 1 and "no C compiler" in lines[0] and cpu_gemv.INSTALL_FIX in lines[0]


@pytest.mark.slow
def test_the_demo_gguf_agrees_without_them(monkeypatch, retry):
    """The demo model's own int4 / int8 weights, as a fresh install serves them, with and without the C kernels."""
    monkeypatch.setenv("WSLM_GGUF_DEQUANTIZE", "0")

    def greedy() -> tuple[LLM, list[int], list[int]]:
        retry()
        llm = LLM("demo", kv_cache_memory=64 << 20, max_model_len=512, max_num_seqs=4, enforce_eager=True)
        prompt = llm.llm_engine.apply_chat_template(CHAT, None, True)
        out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
        return llm, prompt, list(out[0].outputs[0].token_ids)

    _, prompt, fast = greedy()
    monkeypatch.setenv(cpu_gemv.ENV_VAR, "0")
    llm, _, off = greedy()
    assert llm.llm_engine.executor.runner.native is None
    # Measured 31/32 on an AVX-512 Xeon; a tie that goes the other way does not decide every later step.
    assert off == fast or _teacher_forced_agreement(llm, prompt, fast) >= 0.9
