"""Quantized weights against their dequantized reference: int8 / int4 kernels, GGUF block types (each
written by the test, decoded by our repacker and by gguf's reference dequantizer), fused mixed formats."""

import numpy as np
import pytest
import torch

from wslm.backend.quant.int4 import Int4Codes, quantize_int4, quantize_int4_codes
from wslm.backend.quant.int8 import quantize_int8
from wslm.backend.quant.linear import finalize, fuse_rows

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _native_gguf(monkeypatch):
    monkeypatch.setenv("WSLM_GGUF_DEQUANTIZE", "0")  # conftest dequantizes GGUF for the HF parity tests


def _close(out: torch.Tensor, ref: torch.Tensor, rel: float = 0.02) -> None:
    # Activations enter the CPU kernels as bf16 (their fast path): ~3 significant digits.
    err = (out.float() - ref.float()).abs().max().item()
    assert err <= rel * ref.abs().max().item(), (err, ref.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 5, 33, 80])  # from 32 rows: expanded slices and a bf16 GEMM
def test_int8_kernel_matches_dequantized(dtype, m, monkeypatch):
    from wslm.backend.quant import int8

    monkeypatch.setattr(int8, "_EXPAND_ROWS", 64)  # several slices of the 96 rows
    torch.manual_seed(m)
    w, x = torch.randn(96, 128), torch.randn(m, 128, dtype=dtype)
    q = quantize_int8(w)
    assert (q.dequantize() - w).abs().max() <= w.abs().amax(1).max() / 127
    out = q.apply(x)
    assert out.dtype == dtype and out.shape == (m, 96)
    _close(out, x.float() @ q.dequantize().t())


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("m", [1, 7, 40])
def test_int4_kernel_matches_dequantized(group, m):
    torch.manual_seed(group + m)
    w, x = torch.randn(64, 256), torch.randn(m, 256)
    codes = quantize_int4_codes(w, group)
    ref = codes.dequantize()
    assert (ref - w).abs().max() <= (w.abs().max() * 2 / 15) * 0.51 + 1e-6  # half a step of the group range
    packed = codes.pack(CPU)
    _close(packed.dequantize(), ref)
    _close(packed.apply(x), x @ ref.t())
    bias = torch.randn(64)
    _close(packed.apply(x, bias), x @ ref.t() + bias)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_float32_kernels_on_request_round_nothing_to_bf16(fmt, monkeypatch):
    # WSLM_QUANT_FLOAT32=1 with a float32 engine: scales kept in float32 and the kernel run in float32,
    # so the product is the dequantized weight's float32 product (bf16 would be off by ~1e-3 relative).
    monkeypatch.setenv("WSLM_QUANT_FLOAT32", "1")
    torch.manual_seed(0)
    w, x = torch.randn(64, 256), torch.randn(3, 256)
    src = quantize_int8(w) if fmt == "int8" else quantize_int4_codes(w, 32)
    q = finalize(src, CPU, torch.float32)
    assert (q.scales if fmt == "int8" else q.scales_and_zeros).dtype == torch.float32
    out, ref = q.apply(x), x @ q.dequantize().t()
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    bf16 = finalize(src, CPU, torch.bfloat16)  # a bf16 engine keeps bf16 scales
    assert (bf16.scales if fmt == "int8" else bf16.scales_and_zeros).dtype == torch.bfloat16


@pytest.mark.parametrize("act_order", [False, True])
def test_int4_many_rows_expand_from_the_pack_and_match(act_order):
    """From DENSE_ROWS rows on CPU the weight is expanded from torch's pack and multiplied in bf16 (the
    per-row kernel grows linearly with the rows): same products as the kernel's, read-back exact."""
    from wslm.backend.quant.int4_dense import DENSE_ROWS

    torch.manual_seed(5)
    w = torch.randn(128, 256)
    perm = torch.randperm(256) if act_order else None
    codes = quantize_int4_codes(w if perm is None else w[:, perm], 32)
    codes.perm = perm
    packed = codes.pack(CPU)
    assert packed.unpackable
    ref = codes.dequantize()
    torch.testing.assert_close(packed.dequantize(), ref, atol=0.02 * ref.abs().max().item(), rtol=0)
    x = torch.randn(DENSE_ROWS, 256)
    _close(packed.apply(x), x @ ref.t())
    _close(packed.apply(x[:5]), x[:5] @ ref.t())  # few rows: the kernel
    odd = quantize_int4_codes(torch.randn(48, 256), 32).pack(CPU)  # not whole 64-row blocks: kernel only
    assert not odd.unpackable and odd.apply(x).shape == (DENSE_ROWS, 48)


def test_int4_act_order_permutation_is_undone():
    torch.manual_seed(3)
    w, x = torch.randn(32, 128), torch.randn(3, 128)
    perm = torch.randperm(128)
    codes = quantize_int4_codes(w[:, perm], 32)  # groups over the permuted columns, as act-order GPTQ
    codes.perm = perm
    ref = codes.dequantize()
    _close(ref, w, rel=0.15)
    _close(codes.pack(CPU).apply(x), x @ ref.t())


def test_fusing_mixed_formats_meets_at_int8():
    torch.manual_seed(4)
    a, b = torch.randn(32, 64), torch.randn(16, 64)
    fused = finalize(fuse_rows([quantize_int4_codes(a, 32), quantize_int8(b)]), CPU, torch.float32)
    assert fused.bits == 8 and fused.shape == (48, 64)
    x = torch.randn(2, 64)
    ref = torch.cat([quantize_int4_codes(a, 32).dequantize(), quantize_int8(b).dequantize()])
    _close(fused.apply(x), x @ ref.t())
    both4 = fuse_rows([quantize_int4_codes(a, 32), quantize_int4_codes(b, 32)])
    assert isinstance(both4, Int4Codes) and both4.shape == (48, 64)


# ---- GGUF block types ----------------------------------------------------------------------------
# Byte offsets of the fp16 scale fields inside each block type (llama.cpp's ggml-common.h layouts).
_FP16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
}  # fmt: skip
_QUANTIZABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")  # gguf.quants.quantize covers these


def _blocks(kind: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """Raw GGUF bytes for a [rows, cols] tensor: gguf's own quantizer where it has one, else random
    blocks with sane fp16 scales (every byte pattern is a valid K-quant block)."""
    import gguf

    qtype = gguf.GGMLQuantizationType[kind]
    rng = np.random.default_rng(seed)
    if kind in _QUANTIZABLE:
        return gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for off in _FP16_FIELDS[kind]:
        raw[..., off : off + 2] = (
            rng.uniform(0.001, 0.05, raw.shape[:2]).astype(np.float16)[..., None].view(np.uint8)
        )
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("kind", list(_FP16_FIELDS))
def test_gguf_types_repack_to_what_gguf_dequantizes(tmp_path, kind, monkeypatch):
    import gguf

    monkeypatch.setenv("WSLM_GGUF_BLOCKS", "0")  # the repacked forms (the blocks: tests/test_gguf_blocks.py)

    from wslm.backend.quant.gguf_formats import INT4_TYPES
    from wslm.backend.quant.gguf_weights import iter_gguf_weights

    qtype = gguf.GGMLQuantizationType[kind]
    heads, rows, cols = 4, 64, 256
    path = tmp_path / f"{kind}.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("llama.attention.head_count", heads)
    writer.add_uint32("llama.attention.head_count_kv", heads)
    raw = {
        "blk.0.ffn_up.weight": _blocks(kind, rows, cols, 1),
        "blk.0.attn_q.weight": _blocks(kind, rows, cols, 2),
    }
    for name, data in raw.items():
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    loaded = dict(iter_gguf_weights(path))
    up = loaded["model.layers.0.mlp.up_proj.weight"]
    ref = torch.from_numpy(gguf.quants.dequantize(raw["blk.0.ffn_up.weight"], qtype)).reshape(rows, cols)
    if kind in INT4_TYPES:
        assert isinstance(up, Int4Codes)
        assert torch.equal(up.dequantize(), ref)  # the same codes and scales: exact
    else:
        assert up.bits == 8  # never fewer bits than the source
    x = torch.randn(3, cols)
    _close(finalize(up, CPU, torch.float32).apply(x), x @ ref.t(), rel=0.03)
    # q rows come back in HF's order (llama.cpp permutes them for its rope layout).
    q = finalize(loaded["model.layers.0.self_attn.q_proj.weight"], CPU, torch.float32)
    q_ref = torch.from_numpy(gguf.quants.dequantize(raw["blk.0.attn_q.weight"], qtype)).reshape(rows, cols)
    q_ref = q_ref.reshape(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)
    _close(q.apply(x), x @ q_ref.t(), rel=0.03)


def test_quantize_int4_needs_a_group_that_divides():
    from wslm.backend.quant.int4 import pick_group_size

    assert pick_group_size(576, 128) == 64
    assert pick_group_size(1536, 128) == 128
    with pytest.raises(ValueError, match="divisible by 32"):
        pick_group_size(100)
    assert quantize_int4(torch.randn(16, 64), 32).shape == (16, 64)
    assert finalize(quantize_int4_codes(torch.randn(8, 64), 32), CPU, torch.float32).bits == 8  # 16-row tiles


def test_model_list_counts_gguf_weights_at_their_runtime_size(tmp_path, monkeypatch):
    from wslm.backend.hub.metadata import read_gguf
    from wslm.backend.quant.sizes import gguf_runtime_bytes
    from wslm.demo import demo_model_path

    monkeypatch.setenv("WSLM_CACHE_DIR", str(tmp_path))
    meta = read_gguf(demo_model_path())
    assert set(meta.elements_by_type) == {"Q4_1", "Q8_0", "F32"}
    runtime = gguf_runtime_bytes(meta.elements_by_type)
    size = demo_model_path().stat().st_size
    assert 0.8 * size < runtime < 1.3 * size  # not the 2 bytes per weight of a dequantized model
    assert gguf_runtime_bytes({"Q4_K": 1024, "Q6_K": 1024}) == 576 + 840  # the file's blocks (the default)
    monkeypatch.setenv("WSLM_GGUF_BLOCKS", "0")
    assert gguf_runtime_bytes({"Q4_K": 1024, "Q6_K": 1024}) == 640 + 1024  # repacked: int4 groups, int8 rows
