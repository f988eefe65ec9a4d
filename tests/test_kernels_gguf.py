"""GGUF block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K): the torch reference against gguf-py, and the
Triton GEMV / GEMM / dequantize against the torch reference.

Without CUDA the Triton kernels run under TRITON_INTERPRET=1 on small shapes, in float32 and float16 (the
interpreter rounds float32 -> bfloat16 by truncation, so bfloat16 is checked on a GPU only).

Tolerances, and why. Both sides sum K float32 products in different orders, each within
gamma_K = K * 2^-24 of the exact sum relative to sum_k |x_k w_k| (the standard bound for recursive
summation), so they may differ by 2 * gamma_K * (|x| @ |W|.T). On a GPU the float32 dots use three TF32
products (error ~2^-21 per product): 2^-20 * (|x| @ |W|.T) more. A 16-bit result may then round to the
neighbouring value on one side: one ulp of the output dtype (its eps * |y|). The decode kernel with
16-bit activations splits each float32 weight into hi + lo in that dtype, which keeps it within 2^-16
relative (bfloat16; fp16 2^-20 plus lo's subnormal spacing 2^-24 absolute): that term is added too. The
dequantized weights themselves are compared bit for bit."""

from __future__ import annotations

import os

import numpy as np
import torch

if not torch.cuda.is_available():
    # Must precede the first import of the kernel modules: @triton.jit reads it at decoration time.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

gguf = pytest.importorskip("gguf")

from kernel_testing import random_gguf_blocks  # noqa: E402

from wslm.kernels import configs, gguf_dequantize, gguf_matmul, torch_gguf  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TYPES = list(torch_gguf.FORMATS)
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def _gguf_py(raw: torch.Tensor, name: str) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(raw.cpu().numpy(), gguf.GGMLQuantizationType[name]))


@pytest.mark.parametrize("name", TYPES)
def test_reference_equals_gguf_py_bit_for_bit(name):
    # Random quant/scale bytes (every bit pattern) with zeros, -0, subnormal and largest halves as scales.
    raw = random_gguf_blocks(7, 3 * torch_gguf.FORMATS[name].block_weights, name, seed=1, specials=True)
    ref = _gguf_py(raw, name)
    mine = torch_gguf.dequantize(raw, name)
    assert mine.dtype == torch.float32 and mine.shape == ref.shape
    assert torch.equal(_bits(mine), _bits(ref))
    by_id = torch_gguf.dequantize(raw, gguf.GGMLQuantizationType[name])  # the enum (an int) works too
    assert torch.equal(_bits(by_id), _bits(ref))


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_reference_on_gguf_py_quantized_weights(name):
    # Blocks from gguf-py's own quantizer (it has none for the K-quants): real scales, real minimums.
    w = np.random.default_rng(3).standard_normal((6, 96)).astype(np.float32)
    raw = torch.from_numpy(gguf.quants.quantize(w, gguf.GGMLQuantizationType[name]))
    assert torch.equal(_bits(torch_gguf.dequantize(raw, name)), _bits(_gguf_py(raw, name)))


def test_small_gguf_file_of_every_type(tmp_path):
    """A GGUF written by gguf-py with one tensor per block type, read back memory-mapped: the bytes the
    reader hands out dequantize (reference and Triton alike) to what gguf-py makes of them."""
    path = tmp_path / "blocks.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    made = {}
    for i, name in enumerate(TYPES):
        raw = random_gguf_blocks(5, 2 * torch_gguf.FORMATS[name].block_weights, name, seed=10 + i)
        made[name] = raw
        writer.add_tensor(f"w.{name}", raw.numpy(), raw_dtype=gguf.GGMLQuantizationType[name])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = gguf.GGUFReader(str(path))
    for t in reader.tensors:
        name = t.name.split(".")[1]
        assert t.tensor_type.name == name
        raw = torch.from_numpy(np.array(t.data)).reshape(made[name].shape)
        assert torch.equal(raw, made[name])
        expected = _gguf_py(raw, name)
        assert torch.equal(_bits(torch_gguf.dequantize(raw, t.tensor_type)), _bits(expected))
        tri = gguf_dequantize(raw.to(DEVICE), name, backend="triton").cpu()
        assert torch.equal(_bits(tri), _bits(expected)), name


@pytest.mark.parametrize("name", TYPES)
def test_triton_dequantize_bit_for_bit(name):
    # 11 rows (not a multiple of the 8-row tile), two blocks; special halves included.
    raw = random_gguf_blocks(11, 2 * torch_gguf.FORMATS[name].block_weights, name, seed=2, specials=True)
    tri = gguf_dequantize(raw.to(DEVICE), name, backend="triton").cpu()
    assert torch.equal(_bits(tri), _bits(torch_gguf.dequantize(raw, name)))
    # a gather of rows (what an embedding lookup passes): a non-contiguous view's copy
    rows = torch.tensor([9, 0, 4])
    assert torch.equal(_bits(gguf_dequantize(raw[rows].to(DEVICE), name, backend="triton").cpu()),
                       _bits(torch_gguf.dequantize(raw, name)[rows]))


def _assert_within(y: torch.Tensor, x: torch.Tensor, raw: torch.Tensor, name: str, round_weight: bool,
                   split_w: bool = False) -> None:
    """y (the kernel's) against torch_gguf.matmul within the bound the module docstring derives."""
    y = y.float().cpu()
    x, raw = x.cpu(), raw.cpu()
    ref = torch_gguf.matmul(x, raw, name, round_weight=round_weight).float()
    w = torch_gguf.dequantize(raw, name)
    if round_weight:
        w = w.to(x.dtype).float()
    k = w.shape[1]
    mag = x.float().abs() @ w.abs().t()
    bound = 2 * k * 2.0**-24 * mag
    if DEVICE == "cuda" and x.dtype == torch.float32:
        bound += 2.0**-20 * mag  # tf32x3 dots
    if split_w:
        bound += (2.0**-16 if x.dtype == torch.bfloat16 else 2.0**-20) * mag + 2.0**-24 * x.float().abs().sum(-1, True)
    if x.dtype != torch.float32:
        bound += torch.finfo(x.dtype).eps * ref.abs()
    err = (y - ref).abs()
    worst = (err - bound).max()
    assert worst <= 1e-30, f"{name} {x.dtype}: error {err.max():.3g} exceeds its bound by {worst:.3g}"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("rows", [1, 5, 32])
@pytest.mark.parametrize("name", TYPES)
def test_gemv_decode_rows(name, rows, dtype):
    # 40 outputs (a partial tile); K = 4 K-quant superblocks / 32 small blocks, split over several programs.
    k = 1024
    raw = random_gguf_blocks(40, k, name, seed=rows).to(DEVICE)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).to(dtype).to(DEVICE)
    cfg = configs.gguf_gemv_config(name, str(dtype)[6:], rows, 40, k, configs.INTERPRETER_CAPABILITY)
    assert cfg.split_k > 1  # the split-K partial sums are exercised
    y = gguf_matmul(x, raw, name, backend="triton")
    assert y.dtype == dtype and y.shape == (rows, 40)
    _assert_within(y, x, raw, name, round_weight=False, split_w=cfg.split_w)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("name", TYPES)
def test_gemm_prefill(name, dtype):
    fmt = torch_gguf.FORMATS[name]
    k = 512 if fmt.block_weights == 256 else 256
    raw = random_gguf_blocks(72, k, name, seed=5).to(DEVICE)  # 72 outputs: two tiles, the second partial
    x = torch.randn(70, k, generator=torch.Generator().manual_seed(5)).to(dtype).to(DEVICE)
    y = gguf_matmul(x, raw, name, backend="triton")
    assert y.dtype == dtype and y.shape == (70, 72)
    _assert_within(y, x, raw, name, round_weight=True)


def test_leading_dims_strided_activations_and_tail_rows():
    # x as a slice of a wider buffer (rows strided) with two leading dims; 3 x 2 = 6 rows -> the GEMV.
    raw = random_gguf_blocks(19, 256, "Q4_K", seed=7).to(DEVICE)
    wide = torch.randn(3, 2, 300, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    x = wide[..., :256]
    y = gguf_matmul(x, raw, "Q4_K", backend="triton")
    assert y.shape == (3, 2, 19)
    _assert_within(y.reshape(6, 19), x.reshape(6, 256), raw, "Q4_K", round_weight=False)
    assert gguf_matmul(x[:0], raw, "Q4_K", backend="triton").shape == (0, 2, 19)


@pytest.mark.parametrize("rows", [3, 40], ids=["gemv", "gemm"])
def test_fused_parts_of_mixed_types_into_column_slices(rows):
    # A Q4_K_M file's q|k|v: Q4_K q and k, Q6_K v, each part written into its columns of one output.
    parts = [("Q4_K", 24), ("Q4_K", 8), ("Q6_K", 8)]
    raws = [random_gguf_blocks(n, 256, name, seed=i).to(DEVICE) for i, (name, n) in enumerate(parts)]
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    out = torch.full((rows, 40), float("nan"), device=DEVICE)
    n0 = 0
    for (name, n), raw in zip(parts, raws, strict=True):
        assert gguf_matmul(x, raw, name, backend="triton", out=out[:, n0:n0 + n]).data_ptr() == out[:, n0].data_ptr()
        _assert_within(out[:, n0:n0 + n], x, raw, name, round_weight=rows > configs.GGUF_GEMV_MAX_ROWS)
        n0 += n
    ref = torch.empty(rows, 40)
    n0 = 0
    for (name, n), raw in zip(parts, raws, strict=True):
        gguf_matmul(x.cpu(), raw.cpu(), name, backend="torch", out=ref[:, n0:n0 + n])
        n0 += n
    # the torch backend fills the slices with exactly its reference products
    assert torch.equal(ref, torch.cat([torch_gguf.matmul(x.cpu(), r.cpu(), name) for (name, _), r in
                                       zip(parts, raws, strict=True)], dim=1))
    with pytest.raises(ValueError, match="out must be"):
        gguf_matmul(x, raws[0], "Q4_K", backend="triton", out=out[:, :23])


def test_cpu_dispatch_is_the_reference_and_errors_name_the_fix():
    raw = random_gguf_blocks(4, 64, "Q8_0", seed=8)
    x = torch.randn(2, 64)
    if DEVICE == "cpu" and not os.environ.get("WSLM_KERNEL_BACKEND"):
        assert torch.equal(gguf_matmul(x, raw, "Q8_0"), torch_gguf.matmul(x, raw, "Q8_0"))
        assert torch.equal(gguf_dequantize(raw, 8), torch_gguf.dequantize(raw, "Q8_0"))
    with pytest.raises(ValueError, match="Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K"):
        torch_gguf.block_format("IQ2_XXS")
    with pytest.raises(ValueError, match="65 features, the Q8_0 weight 64"):
        gguf_matmul(torch.randn(2, 65), raw, "Q8_0", backend="torch")
    with pytest.raises(ValueError, match="34-byte blocks"):
        torch_gguf.weight_shape(raw[:, :40], "Q8_0")
    with pytest.raises(ValueError, match="uint8"):
        torch_gguf.weight_shape(raw.float(), "Q8_0")


def test_configs_are_pure_and_bounded():
    cc = (9, 0)
    one = configs.gguf_gemv_config("Q4_K", "bfloat16", 1, 3072, 3072, cc)
    assert (one.block_m, one.split_w) == (1, False)
    # few outputs split K (down to 4 K tiles per split); many outputs fill the GPU alone
    assert one.split_k > 1 and 3072 // one.block_k // one.split_k >= 4
    assert configs.gguf_gemv_config("Q4_K", "bfloat16", 1, 128256, 3072, cc).split_k == 1
    eight = configs.gguf_gemv_config("Q6_K", "bfloat16", 8, 4096, 4096, cc)
    assert (eight.block_m, eight.split_w) == (16, True)
    assert configs.gguf_gemv_config("Q6_K", "float32", 32, 4096, 4096, cc).block_m == 32
    assert configs.gguf_gemv_config("Q8_0", "float16", 3, 4096, 4096, cc) == configs.gguf_gemv_config(
        "Q8_0", "float16", 3, 4096, 4096, cc)
    with pytest.raises(ValueError, match="rows must be 1..32"):
        configs.gguf_gemv_config("Q4_0", "float16", 33, 64, 64, cc)
    with pytest.raises(ValueError, match="no Triton kernel"):
        configs.gguf_gemm_config("IQ4_XS", "float16", 512, 64, 64, cc)
    big = configs.gguf_gemm_config("Q4_0", "float16", 512, 4096, 4096, (8, 9))
    assert (big.block_m, big.block_n, big.num_stages) == (128, 128, 2)  # 99 KiB cards: 2 stages
    assert configs.gguf_gemm_config("Q4_0", "float16", 512, 4096, 4096, (9, 0)).num_stages == 3


def test_compile_registry_has_every_type_and_kernel():
    import kernel_compile

    chosen = [x for x in kernel_compile.launches() if "triton_gguf" in x.kernel]
    seen = {(x.kernel.split(":")[1], dict(x.constexprs)["QTYPE"], x.capability, x.dtype != "float32")
            for x in chosen}
    kernels = {x[:3] for x in seen}
    for fmt in torch_gguf.FORMATS.values():
        for cc in configs.TARGETS:
            assert ("_gguf_dequant_kernel", fmt.type_id, cc) in kernels  # one code whatever the dtype
            for kernel in ("_gguf_gemv_kernel", "_gguf_gemm_kernel"):
                for sixteen in (True, False):
                    assert (kernel, fmt.type_id, cc, sixteen) in seen


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_gguf_launches_compile_for_every_target():
    """Every GGUF launch the config functions can pick compiles for sm_80/86/89/90 with no shared-memory
    overrun and no spills (sm_89 and sm_90 unless WSLM_COMPILE_ALL=1, as test_kernels_compile.py). ~90
    launches per target at 4-10 s each on a 2-core machine: minutes cold, seconds from Triton's cache."""
    pytest.importorskip("triton")
    import kernel_compile
    from test_kernels_compile import DEFAULT_TARGETS

    targets = configs.TARGETS if os.environ.get("WSLM_COMPILE_ALL") == "1" else DEFAULT_TARGETS
    items = [x for x in kernel_compile.launches() if "triton_gguf" in x.kernel and x.capability in targets]
    results = kernel_compile.compile_all(items, jobs=min(2, os.cpu_count() or 1))
    failures = [f"{r.launch.label()}: {'; '.join(r.problems())}" for r in results if r.problems()]
    assert not failures, f"{len(failures)} of {len(items)} launches do not fit:\n" + "\n".join(failures)
