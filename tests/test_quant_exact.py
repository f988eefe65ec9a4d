"""Each weight format the loader accepts, through its runtime weight, against the file's own dequantized
values (gguf.quants.dequantize for GGUF; the formats' formulas for AWQ and GPTQ): exact where the model
runs float32 under WSLM_QUANT_FLOAT32=1, and within the bounds docs/benchmarks.md states ("Fidelity of
kept-quantized weights") in the default bfloat16 engine."""

import numpy as np
import pytest
import torch
from kernel_testing import gguf_tensor_blocks

from wslm.backend.quant.linear import finalize

CPU = torch.device("cpu")
ROWS, COLS = 64, 512
_KINDS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
# Default (bfloat16 engine) error bounds, relative to the largest |w| of the weight's row, as
# docs/benchmarks.md gives them. int4 types keep their codes; only the scale and zero round to bf16 (2^-8
# relative each: at most 2^-8 (8 s + |z|) <= 2^-7 of the block's largest; measured 0.40%). The others
# go to int8 per row: half a row step (1/254), the step a bf16 value (rounded up, so kept exactly:
# int8.bf16_ceil), at most 2^-7 over rowmax/127; measured 0.40%.
_DEFAULT_BOUND = {"int4": 2**-7, "int8": 1 / 254 * (1 + 2**-7)}


@pytest.fixture(autouse=True)
def _native_gguf(monkeypatch):
    monkeypatch.setenv("WSLM_GGUF_DEQUANTIZE", "0")  # conftest dequantizes GGUF for the HF parity tests


def _blocks(kind: str, seed: int) -> np.ndarray:
    return gguf_tensor_blocks(kind, ROWS, COLS, seed, outliers=True)


def _write(path, kind: str, raw: np.ndarray) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("llama.attention.head_count", 4)
    writer.add_tensor("blk.0.ffn_up.weight", raw, raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _load(path, dtype: torch.dtype):
    from wslm.backend.quant.gguf_weights import iter_gguf_weights

    return finalize(dict(iter_gguf_weights(path, dtype))["model.layers.0.mlp.up_proj.weight"], CPU, dtype)


def _dense(w) -> torch.Tensor:
    return w.float() if isinstance(w, torch.Tensor) else w.dequantize(torch.float32)


@pytest.mark.parametrize("kind", _KINDS)
def test_gguf_runtime_weight_is_the_files_values(tmp_path, kind, monkeypatch):
    import gguf

    from wslm.backend.quant.gguf_blocks import BLOCK_TYPES
    from wslm.backend.quant.gguf_formats import INT4_TYPES

    raw = _blocks(kind, seed=len(kind) + ord(kind[1]))
    ref = torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind])).reshape(ROWS, COLS)
    path = tmp_path / f"{kind}.gguf"
    _write(path, kind, raw)
    x = torch.randn(3, COLS)

    # float32 + the exact switch: int4 types stay int4 (float32 scales), the others stay the file's values.
    monkeypatch.setenv("WSLM_QUANT_FLOAT32", "1")
    exact = _load(path, torch.float32)
    assert getattr(exact, "bits", 32) == (4 if kind in INT4_TYPES else 32)
    assert torch.equal(_dense(exact), ref)
    # The same values through float32 GEMMs that may sum in another order (the int4 path expands its weight
    # in the pack's layout, a transposed view, and torch picks another kernel for it: 2e-4 apart with this
    # test's outliers on an AVX-512 CPU): within float32's bound for sums of COLS products.
    got = exact.apply(x) if exact.__class__ is not torch.Tensor else x @ exact.t()
    bound = 2 * COLS * 2**-24 * (x.abs() @ ref.abs().t())
    assert bool(((got - x @ ref.t()).abs() <= bound).all()), (got - x @ ref.t()).abs().max()

    # The default (WSLM_GGUF_BLOCKS): the types with kernels of their own stay the file's blocks (gguf_blocks.py,
    # issue 36: the file's values exactly, tests/test_gguf_blocks.py checks their products).
    monkeypatch.setenv("WSLM_QUANT_FLOAT32", "0")
    if kind in BLOCK_TYPES:
        blocks = _load(path, torch.bfloat16)
        assert blocks.kind == "gguf" and torch.equal(_dense(blocks), ref)
    # WSLM_GGUF_BLOCKS=0 (and the other types): int4 codes with bf16 scales, or int8 per row.
    monkeypatch.setenv("WSLM_GGUF_BLOCKS", "0")
    default = _load(path, torch.bfloat16)
    form = "int4" if kind in INT4_TYPES else "int8"
    assert default.kind == form
    err = (_dense(default) - ref).abs()
    row_max = ref.abs().amax(dim=1, keepdim=True)
    assert (err / row_max).max().item() <= _DEFAULT_BOUND[form]


@pytest.mark.parametrize("kind", ["F32", "F16", "BF16"])
def test_gguf_dense_types_load_as_stored(tmp_path, kind):
    import gguf

    from wslm.backend.quant.gguf_weights import iter_gguf_weights

    w = np.random.default_rng(0).standard_normal((ROWS, COLS)).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[kind]
    raw = gguf.quants.quantize(w, qtype) if kind == "BF16" else w.astype(np.float16 if kind == "F16" else np.float32)
    _write(tmp_path / "d.gguf", kind, raw)
    got = dict(iter_gguf_weights(tmp_path / "d.gguf"))["model.layers.0.mlp.up_proj.weight"]
    assert torch.equal(got.float(), torch.from_numpy(gguf.quants.dequantize(raw, qtype)).reshape(ROWS, COLS))


# ---- AWQ / GPTQ ----------------------------------------------------------------------------------
_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _pack(v: torch.Tensor, order) -> torch.Tensor:
    """[R, C] 4-bit values -> [R, C/8] int32, column 8 j + order[i] in nibble i of word j."""
    r, c = v.shape
    v = (v.to(torch.int32) & 0xF).reshape(r, c // 8, 8)
    out = torch.zeros(r, c // 8, dtype=torch.int32)
    for i, col in enumerate(order):
        out |= v[:, :, col] << (4 * i)
    return out


def _packed_checkpoint(method: str, group: int, act_order: bool = False):
    """One linear's checkpoint tensors and the reference w[n, k] = (q[k, n] - z[g(k), n]) * s[g(k), n]."""
    gen = torch.Generator().manual_seed(3)
    n, k = ROWS, COLS
    g_idx = torch.arange(k) // group
    if act_order:
        g_idx = g_idx[torch.randperm(k, generator=gen)]
    q = torch.randint(0, 16, (k, n), generator=gen)
    # GPTQ's original format stores z - 1 in 4 bits: its quantizers keep z >= 1.
    z = torch.randint(0 if method == "awq" else 1, 16, (k // group, n), generator=gen)
    s = (torch.rand(k // group, n, generator=gen) * 0.02 + 1e-3).half()
    ref = ((q - z[g_idx]).float() * s.float()[g_idx]).t()
    if method == "awq":
        parts = {"qweight": _pack(q, _AWQ_ORDER), "qzeros": _pack(z, _AWQ_ORDER), "scales": s}
    else:  # GPTQ: qweight packed along K, zeros stored minus one (the original "gptq" format)
        parts = {"qweight": _pack(q.t(), range(8)).t().contiguous(), "qzeros": _pack(z - 1, range(8)),
                 "scales": s, "g_idx": g_idx.to(torch.int32)}  # fmt: skip
    return parts, ref


@pytest.mark.parametrize("method,act_order", [("awq", False), ("gptq", False), ("gptq", True)])
def test_awq_gptq_runtime_weight_is_the_checkpoints_values(method, act_order, monkeypatch):
    from wslm.backend.quant import awq, gptq

    group = 128
    parts, ref = _packed_checkpoint(method, group, act_order)
    codes = awq.to_codes(parts, group) if method == "awq" else gptq.to_codes(parts, group)
    monkeypatch.setenv("WSLM_QUANT_FLOAT32", "1")
    exact = finalize(codes, CPU, torch.float32)
    assert exact.kind == "int4" and torch.equal(exact.dequantize(), ref)
    x = torch.randn(3, COLS)
    torch.testing.assert_close(exact.apply(x), x @ ref.t(), rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("WSLM_QUANT_FLOAT32", "0")
    err = (finalize(codes, CPU, torch.bfloat16).dequantize() - ref).abs()
    assert (err / ref.abs().amax(dim=1, keepdim=True)).max().item() <= _DEFAULT_BOUND["int4"]


# ---- the demo GGUF kept quantized, float32 + the exact switch, against transformers -------------------
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one short sentence."},
     {"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "user", "content": "Give me three tips for learning Python."}],
    [{"role": "user", "content": "Explain what a black hole is to a child."}],
    [{"role": "user", "content": "Write a short story about a lighthouse keeper and a storm."}],
]  # fmt: skip


def test_demo_gguf_kept_quantized_float32_exact_matches_transformers(demo_hf_model, monkeypatch):
    """Q4_1 layers stay int4 (float32 scales: the file's values exactly, expanded for one float32 GEMM
    per call) and the Q8_0 table the file's values: greedy decoding is transformers' token for token,
    all six chats in one batched generate call."""
    from engine_helpers import hf_greedy

    from wslm.backend import LLM, SamplingParams

    monkeypatch.setenv("WSLM_QUANT_FLOAT32", "1")
    llm = LLM("demo", kv_cache_memory=32 << 20, max_model_len=512, dtype="float32")
    model = llm.llm_engine.executor.runner.model
    qkv = model.layers[0].self_attn.qkv_proj.weight
    assert qkv.kind == "int4" and qkv.scales_and_zeros.dtype == torch.float32  # kept quantized
    engine, tok = llm.llm_engine, llm.get_tokenizer()
    prompts = [engine.apply_chat_template(c) for c in CHATS]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=40))
    for prompt, out in zip(prompts, outs):
        assert list(out.outputs[0].token_ids) == hf_greedy(demo_hf_model, tok, prompt, 40)
