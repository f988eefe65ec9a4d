"""MoE experts kept quantized: a tiny Qwen3-MoE GGUF written here with Q8_0 / Q4_0 experts loads with its
experts as int8 / int4 weights (not 16-bit), and an int8 / int4 quantize-on-load of the same model's folder
quantizes its experts too. Each runs within a stated tolerance of the same engine on the dequantized
experts. Tolerances: each MoE layer's output within 2% of its largest value on the same routed tokens (the
int8/int4 kernels take bf16 activations: ~0.5% measured); through the whole random model, where a router
near a tie flips an expert for some tokens, the median prompt log-probability within 0.05 nats, 90% of
them within 0.12, and teacher-forced greedy tokens agreeing on >= 2/3 of steps (one step at a time given
the reference's prefix, so one near-tied step does not decide the rest)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_helpers import demo_tokenizer
from test_modeling_moe import TEXTS, _stacked_experts, make_moe_model

from wslm import kernels
from wslm.backend import LLM, SamplingParams
from wslm.backend.quant.gguf_blocks import GGUFBlockWeight
from wslm.backend.quant.int4 import Int4Weight
from wslm.backend.quant.int8 import Int8Weight

STEPS = 12


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """A tiny Qwen3-MoE (hidden 64, 4 heads, experts 64 wide: whole 4-bit groups, on each of 2 ranks too) as a folder,
    the HF model, its tokenizer, and a writer of its GGUF with experts of a given type."""
    from gguf_writer import write_gguf

    tok = demo_tokenizer()
    root = tmp_path_factory.mktemp("moeq")
    sizes = dict(hidden_size=64, moe_intermediate_size=64, num_attention_heads=4)
    folder, hf = make_moe_model(root / "qwen3_moe", "qwen3_moe", tok, **sizes)

    def gguf(qtype: str) -> str:
        path = root / f"tiny-qwen3moe-{qtype}.gguf"
        if not path.exists():
            write_gguf(path, hf, "qwen3moe", tensors=_stacked_experts(folder), expert_type=qtype)
        return str(path)

    return folder, gguf, tok


def _experts(llm: LLM) -> list:
    model = llm.llm_engine.executor.runner.model
    return [layer.mlp.experts for layer in model.layers]


def _prompt_logprobs(llm: LLM, prompt: list[int]) -> torch.Tensor:
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    out = llm.generate([{"prompt_token_ids": prompt}], params)[0]
    return torch.tensor([entry[t].logprob for t, entry in zip(prompt[1:], out.prompt_logprobs[1:])])


def _assert_close_to(quant: LLM, dense: LLM, tok) -> None:
    for q in _experts(quant):  # the layer itself, same tokens, same routing
        x = torch.randn(40, q.hidden_size, generator=torch.Generator().manual_seed(0))
        weights, ids = q.route(x)
        got = kernels.fused_moe(x, q.w13, q.w2, weights, ids, q.act_and_mul)
        want = kernels.fused_moe(x, _dense(q.w13), _dense(q.w2), weights, ids, q.act_and_mul)
        assert (got - want).abs().max() <= 0.02 * want.abs().max()
    diffs, agree, steps = [], 0, 0
    for text in TEXTS[1:]:
        prompt = tok.encode(text)
        diffs.append((_prompt_logprobs(quant, prompt) - _prompt_logprobs(dense, prompt)).abs())
        params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)
        reference = list(dense.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0].token_ids)
        one = SamplingParams(temperature=0, max_tokens=1)
        got = [quant.generate([{"prompt_token_ids": prompt + reference[:i]}], one)[0].outputs[0].token_ids[0]
               for i in range(STEPS)]  # fmt: skip
        agree += sum(a == b for a, b in zip(got, reference))
        steps += STEPS
    diff = torch.cat(diffs)
    # Measured: medians 0.007-0.023, 90th percentiles 0.017-0.059; agreement 0.875-1.0 where int4 multiplies
    # bf16 rows (and on a Zen 4), 0.75 on a Zen 3 (AVX2: rows rounded to int8 per 32 columns, as llama.cpp
    # does). A random model's logits are nearly flat, so a bf16-sized error flips some picks; a wiring
    # mistake (a wrong expert, scale or group) drops agreement near 0 and the log-probabilities far apart.
    assert diff.median() <= 0.05 and diff.quantile(0.9) <= 0.12
    assert agree / steps >= 2 / 3


def _assert_experts_are_the_files(llm, path: str) -> None:
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(path)
    stacked = {t.name: t for t in reader.tensors if "_exps" in t.name}
    for i, layer in enumerate(_experts(llm)):
        gate, up, down = (stacked[f"blk.{i}.ffn_{n}_exps.weight"] for n in ("gate", "up", "down"))
        for e in range(8):
            want = [gguf.quants.dequantize(np.asarray(t.data)[e], t.tensor_type) for t in (gate, up, down)]
            w13 = layer.w13[e].dequantize(torch.float32)
            torch.testing.assert_close(w13, torch.from_numpy(np.concatenate(want[:2])), rtol=0, atol=0)
            torch.testing.assert_close(layer.w2[e].dequantize(torch.float32), torch.from_numpy(want[2]), rtol=0, atol=0)


def _dense(weights) -> torch.Tensor:
    if isinstance(weights, torch.Tensor):
        return weights
    return torch.stack([w.dequantize(torch.float32) for w in weights])


@pytest.mark.parametrize(("qtype", "kind", "max_bytes"), [("Q8_0", Int8Weight, 1.1), ("Q4_0", Int4Weight, 0.7),
                                                     ("Q8_0", GGUFBlockWeight, 1.07), ("Q4_0", GGUFBlockWeight, 0.57)])
def test_gguf_moe_experts_stay_quantized_and_match_dequantized(moe, qtype, kind, max_bytes, monkeypatch):
    """By default each expert is its blocks in the mapped file (GGUFBlockWeight: the file's bytes, its exact
    values); WSLM_GGUF_BLOCKS=0 repacks them as int8 / int4."""
    folder, gguf, tok = moe
    monkeypatch.setenv("WSLM_GGUF_CACHE", "0")
    monkeypatch.setenv("WSLM_GGUF_DEQUANTIZE", "0")  # conftest dequantizes GGUF for the HF parity tests
    monkeypatch.setenv("WSLM_GGUF_BLOCKS", "1" if kind is GGUFBlockWeight else "0")
    path = gguf(qtype)
    kw = dict(tokenizer=str(folder), kv_cache_memory=16 << 20, max_model_len=256, dtype="float32")
    quant = LLM(path, **kw)
    for layer in _experts(quant):
        assert len(layer.w13) == len(layer.w2) == 8
        assert all(isinstance(w, kind) for w in (*layer.w13, *layer.w2))
        elements = sum(w.shape[0] * w.shape[1] for w in (*layer.w13, *layer.w2))
        assert layer.nbytes <= max_bytes * elements  # bytes per weight: int8 ~1, int4 ~0.6 (fp32: 4)
    if kind is GGUFBlockWeight:  # the file's values exactly: gguf-py's dequantization of each expert's blocks
        _assert_experts_are_the_files(quant, path)
    monkeypatch.setenv("WSLM_GGUF_DEQUANTIZE", "1")
    # `wslm models list` counts the experts at their kept size (int4 0.625 / int8 1 byte a weight), not 16-bit.
    from wslm.backend.hub.metadata import _read_gguf_uncached
    from wslm.backend.quant.sizes import gguf_runtime_bytes

    by_type = _read_gguf_uncached(Path(path)).elements_by_type
    experts = sum(w.shape[0] * w.shape[1] for layer in _experts(quant) for w in (*layer.w13, *layer.w2))
    assert by_type[qtype] == experts
    assert gguf_runtime_bytes({qtype: by_type[qtype]}) <= max_bytes * experts
    dense = LLM(path, **kw)
    assert all(isinstance(layer.w13, torch.Tensor) for layer in _experts(dense))  # the stacked 16/32-bit form
    _assert_close_to(quant, dense, tok)


@pytest.mark.parametrize(("method", "kind"), [("int8", Int8Weight), ("int4", Int4Weight)])
def test_quantize_on_load_covers_moe_experts(moe, method, kind):
    """The folder quantized while it loads: every expert quantized; the reference is the same engine unquantized
    with the quantized experts' dequantized values copied in (so only the kernels differ)."""
    folder, _, tok = moe
    kw = dict(kv_cache_memory=16 << 20, max_model_len=256, dtype="float32")
    quant = LLM(str(folder), quantization=method, **kw)
    dense = LLM(str(folder), **kw)
    for q, d in zip(_experts(quant), _experts(dense)):
        assert all(isinstance(w, kind) for w in (*q.w13, *q.w2))
        d.w13, d.w2 = _dense(q.w13), _dense(q.w2)
    qmodel, dmodel = quant.llm_engine.executor.runner.model, dense.llm_engine.executor.runner.model
    for qlayer, dlayer in zip(qmodel.layers, dmodel.layers):  # attention quantized too: same values in both
        for name in ("qkv_proj", "o_proj"):
            getattr(dlayer.self_attn, name).weight = getattr(qlayer.self_attn, name).weight.dequantize(torch.float32)
    dmodel.embed_tokens.weight = qmodel.embed_tokens.weight.dequantize(torch.float32)
    dmodel.lm_head.weight = qmodel.lm_head.weight.dequantize(torch.float32)
    dense.llm_engine.executor.runner.weights_updated()
    _assert_close_to(quant, dense, tok)


@pytest.mark.parametrize("source", ["Q4_0", "Q8_0", "int8"])
def test_tp2_ranks_hold_the_quantized_experts_sliced(moe, source, monkeypatch):
    """Each of 2 ranks keeps its slice of every expert in the expert's own format (gate/up rows, down input
    columns with their scales and whole blocks / 4-bit groups), dequantizing to exactly the one-device
    expert's slice."""
    from test_engine_tp import _load_as_rank

    folder, gguf, _ = moe
    path, method = (str(folder), source) if source == "int8" else (gguf(source), None)
    models = []
    for rank, size in ((0, 1), (0, 2), (1, 2)):  # _load_as_rank undoes the monkeypatches when it returns
        monkeypatch.setenv("WSLM_GGUF_CACHE", "0")
        monkeypatch.setenv("WSLM_GGUF_DEQUANTIZE", "0")
        models.append(_load_as_rank(monkeypatch, path, method, rank, size, tokenizer=str(folder)))
    full, *ranks = models
    kind = Int8Weight if source == "int8" else GGUFBlockWeight  # a GGUF's experts: their blocks, sliced
    for i, layer in enumerate(full.layers):
        one = layer.mlp.experts
        for e in range(8):
            gate, up = one.w13[e].dequantize(torch.float32).chunk(2)
            down = one.w2[e].dequantize(torch.float32)
            for r, model in enumerate(ranks):
                shard = model.layers[i].mlp.experts
                assert isinstance(shard.w13[e], kind) and isinstance(shard.w2[e], kind)
                w13 = shard.w13[e].dequantize(torch.float32)
                torch.testing.assert_close(w13, torch.cat([gate.chunk(2)[r], up.chunk(2)[r]]), rtol=0, atol=0)
                torch.testing.assert_close(shard.w2[e].dequantize(torch.float32), down.chunk(2, dim=1)[r], rtol=0, atol=0)


def test_a_rank_share_that_splits_the_experts_4bit_groups_is_refused(moe, monkeypatch):
    """4 ranks would leave each 16 of an expert's 64 down-projection columns: half a 4-bit group. (The
    engine refuses that size before any worker starts: wslm.tp_sizes counts the experts' width.)"""
    from test_engine_tp import _load_as_rank

    from wslm.tp_sizes import refusal

    folder, gguf, _ = moe
    shape = dict(num_heads=8, num_kv_heads=4, intermediate_size=128, head_dim=16, quant_group_size=32)
    assert not refusal(4, **shape) and "4-bit groups of 32" in refusal(4, **shape, moe_intermediate_size=64)
    monkeypatch.setenv("WSLM_GGUF_CACHE", "0")
    monkeypatch.setenv("WSLM_GGUF_DEQUANTIZE", "0")
    with pytest.raises(ValueError, match=r"Q4_0 weight's 64 input columns into shards of 16"):
        _load_as_rank(monkeypatch, gguf("Q4_0"), None, 0, 4, tokenizer=str(folder))


@pytest.mark.parametrize(("method", "act_order"), [("awq", False), ("gptq", True)])
def test_awq_gptq_moe_experts_stay_int4(moe, tmp_path, method, act_order):
    """AWQ / GPTQ checkpoints quantize every expert's projections: they load as int4 (act-order GPTQ's gate and
    up sort their columns differently, so they stay two int4 matmuls) holding the checkpoint's exact values."""
    from test_quant_awq_gptq import _make_checkpoint

    from wslm.backend.quant.linear import RowStack

    folder, _, _ = moe
    reference = _make_checkpoint(folder, tmp_path / method, method, act_order=act_order)
    llm = LLM(str(tmp_path / method), kv_cache_memory=16 << 20, max_model_len=256, dtype="float32")
    for i, layer in enumerate(_experts(llm)):
        for e in range(8):
            prefix = f"model.layers.{i}.mlp.experts.{e}"
            w13, w2 = layer.w13[e], layer.w2[e]
            assert isinstance(w2, Int4Weight) and isinstance(w13, RowStack if act_order else Int4Weight)
            want = torch.cat([reference[f"{prefix}.gate_proj.weight"], reference[f"{prefix}.up_proj.weight"]])
            torch.testing.assert_close(w13.dequantize(torch.float32), want, rtol=0.01, atol=0.01)
            torch.testing.assert_close(w2.dequantize(torch.float32), reference[f"{prefix}.down_proj.weight"],
                                       rtol=0.01, atol=0.01)  # fmt: skip
    out = llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=4, ignore_eos=True))[0]
    assert len(out.outputs[0].token_ids) == 4


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0"])
def test_c_decode_step_computes_the_experts(moe, qtype, dtype, monkeypatch):
    """A lone sequence's decode step runs in C with the experts (cpu_layer_body.h's moe: router, top-k, each
    expert's blocks in place): the eager step's logits and KV within the kernels' rounding (float32: ~3e-7 of
    the largest logit measured), the same bits on 1, 2 or 3 threads, and, in float32, a greedy chat decoded in
    C giving the eager engine's tokens."""
    from test_cpu_native import _compare, assert_same_bits_on_threads

    from wslm.backend.platforms.cpu.decode_native import why_not
    from wslm.kernels import cpu_gemv

    if cpu_gemv.library() is None:
        pytest.skip("no C compiler: the C kernels are not built")
    folder, gguf, tok = moe
    monkeypatch.setenv("WSLM_GGUF_CACHE", "0")
    monkeypatch.setenv("WSLM_GGUF_DEQUANTIZE", "0")
    kw = dict(tokenizer=str(folder), kv_cache_memory=16 << 20, block_size=8, max_model_len=256, dtype=dtype,
              enforce_eager=True)  # fmt: skip
    llm = LLM(gguf(qtype), **kw)
    runner = llm.llm_engine.executor.runner
    assert runner.native is not None and runner.native.has_moe, why_not(runner.model, runner.kv_pool)
    prompt = tok.encode(TEXTS[1])
    logit_err, kv_err = _compare(llm, prompt)
    assert logit_err < 0.05 and kv_err < 0.05  # the same kernels; the router and sums in another order
    assert_same_bits_on_threads(llm, prompt)
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)
    steps = runner.native.steps
    got = llm.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0].token_ids
    assert runner.native.steps >= steps + STEPS - 1  # every decode step in C
    monkeypatch.setenv("WSLM_CPU_NATIVE_DECODE", "0")
    eager = LLM(gguf(qtype), **kw)
    assert eager.llm_engine.executor.runner.native is None
    want = eager.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0].token_ids
    if dtype == "float32":  # bf16: a random model's near-ties branch on the router's or a sum's rounding
        assert list(got) == list(want)
