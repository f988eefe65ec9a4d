"""wslm/kernels/cpu_gemv.py: the int8 and int4 decode kernels built with the system's C compiler match
torch's kernels (same fp32 sums, up to their order), on one thread and several, and every case they do
not take (no compiler, turned off, too many rows, float32 rows) falls back to torch's kernel."""

from __future__ import annotations

import pytest
import torch

from wslm.backend.quant.int8 import Int8Weight, quantize_int8
from wslm.kernels import cpu_gemv

pytestmark = pytest.mark.skipif(cpu_gemv.compiler() is None, reason="no C compiler")


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A library state of its own, built into a temporary cache."""
    monkeypatch.setattr(cpu_gemv, "_tried", False)
    monkeypatch.setattr(cpu_gemv, "_lib", None)
    monkeypatch.setattr(cpu_gemv, "_why", None)
    monkeypatch.setattr(cpu_gemv, "_cache_dir", lambda: tmp_path)
    return tmp_path


def _weight(n: int, k: int) -> Int8Weight:
    torch.manual_seed(n + k)
    return quantize_int8(torch.randn(n, k) * 0.05)


@pytest.mark.parametrize("rows", [1, 3, 16])
def test_matches_torch_int8_kernel(rows):
    w = _weight(1000, 320)
    x = torch.randn(rows, 320).bfloat16()
    assert cpu_gemv.int8_mm_ok(x, w.qweight, w.scales)
    ours = cpu_gemv.int8_mm(x, w.qweight, w.scales)
    ref = torch.ops.aten._weight_int8pack_mm(x, w.qweight, w.scales)
    assert ours.dtype == torch.bfloat16 and ours.shape == (rows, 1000)
    # Same products, other summation order: at most one bf16 rounding step apart.
    torch.testing.assert_close(ours.float(), ref.float(), rtol=2**-7, atol=1e-3)
    exact = x.float() @ w.dequantize(torch.float32).t()
    assert (ours.float() - exact).abs().max() <= (ref.float() - exact).abs().max() * 1.5 + 1e-3


def test_threads_split_rows_without_changing_results():
    w = _weight(512, 64)
    x = torch.randn(2, 64).bfloat16()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_gemv.int8_mm(x, w.qweight, w.scales)
        torch.set_num_threads(2)
        two = cpu_gemv.int8_mm(x, w.qweight, w.scales)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_int8_weight_uses_it_with_bias_and_falls_back_beyond_it():
    w = _weight(256, 128)
    bias = torch.randn(256).bfloat16()
    x = torch.randn(2, 128).bfloat16()
    out = w.apply(x, bias)
    torch.testing.assert_close(out, cpu_gemv.int8_mm(x, w.qweight, w.scales) + bias)
    many = torch.randn(cpu_gemv.MAX_ROWS + 1, 128).bfloat16()
    assert not cpu_gemv.int8_mm_ok(many, w.qweight, w.scales)
    assert not cpu_gemv.int8_mm_ok(x.float(), w.qweight, w.scales)
    assert not cpu_gemv.int8_mm_ok(torch.randn(128, 2).bfloat16().t(), w.qweight, w.scales)  # not contiguous
    odd = _weight(256, 72)  # 72 columns: not a multiple of 16
    assert not cpu_gemv.int8_mm_ok(torch.randn(1, 72).bfloat16(), odd.qweight, odd.scales)


def test_built_once_into_the_cache(fresh):
    lib = cpu_gemv.library()
    assert lib is not None
    built = list(fresh.glob("cpu_gemv-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    cpu_gemv._tried = False
    cpu_gemv._lib = None
    assert cpu_gemv.library() is not None
    assert built[0].stat().st_mtime_ns == stamp  # reused, not rebuilt


def test_off_or_without_a_compiler_torch_kernel_serves(fresh, monkeypatch):
    monkeypatch.setenv(cpu_gemv.ENV_VAR, "0")
    assert cpu_gemv.library() is None
    w = _weight(64, 32)
    x = torch.randn(1, 32).bfloat16()
    assert not cpu_gemv.int8_mm_ok(x, w.qweight, w.scales)
    torch.testing.assert_close(w.apply(x), torch.ops.aten._weight_int8pack_mm(x, w.qweight, w.scales))

    monkeypatch.delenv(cpu_gemv.ENV_VAR)
    monkeypatch.setattr(cpu_gemv, "_tried", False)
    monkeypatch.setattr(cpu_gemv, "compiler", lambda: None)
    assert cpu_gemv.library() is None
    assert "no C compiler" in cpu_gemv.why_unavailable() and "build-essential" in cpu_gemv.why_unavailable()


def test_a_failing_build_is_reported_not_raised(fresh, monkeypatch, tmp_path):
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(cpu_gemv, "SOURCES", (broken,))
    assert cpu_gemv.library() is None
    assert "building the C kernels failed" in cpu_gemv.why_unavailable()
    assert cpu_gemv.check_build(cpu_gemv.compiler())  # doctor's question: the compiler's error
    assert not list(fresh.glob("*.so"))  # no half-written library left behind


@pytest.mark.parametrize(("n", "k", "group"), [(128, 64, 32), (192, 256, 128), (64, 96, 32)])
def test_int4_matches_torch_int4_kernel(n, k, group):
    from wslm.backend.quant.int4 import Int4Codes

    torch.manual_seed(n + k)
    codes = Int4Codes(torch.randint(0, 16, (n, k), dtype=torch.uint8), torch.rand(n, k // group) * 0.02,
                      torch.randn(n, k // group) * 0.02, group)  # fmt: skip
    w = codes.pack(torch.device("cpu"))
    assert w.unpackable  # torch's pack has the layout the kernel reads
    x = torch.randn(1, k).bfloat16()
    assert cpu_gemv.int4_mv_ok(x, w.packed, w.scales_and_zeros, group, w.block_n)
    exact = cpu_gemv.int4_mv(x, w.packed, w.scales_and_zeros, group, exact=True, block_n=w.block_n)
    ref = torch.ops.aten._weight_int4pack_mm_for_cpu(x, w.packed, group, w.scales_and_zeros)
    torch.testing.assert_close(exact.float(), ref.float(), rtol=2**-7, atol=1e-3)  # same sums, same order
    ours = cpu_gemv.int4_mv(x, w.packed, w.scales_and_zeros, group, block_n=w.block_n)
    if cpu_gemv.int4_q8():  # the exact product of the dequantized weight and the int8-rounded row
        blocks = x.float().view(-1, 32)
        d = blocks.abs().amax(-1, keepdim=True) / 127
        xq = (torch.where(d > 0, blocks / d, 0).round() * d).view(1, k).double()
        want = xq @ w.dequantize(torch.float64).T
        torch.testing.assert_close(ours.double(), want, rtol=2**-7, atol=1e-4)
        assert (ours.float() - ref.float()).abs().max() < 0.05 * ref.abs().max()  # and near torch's
    else:
        assert torch.equal(ours, exact)
    torch.testing.assert_close(w.apply(x), ours)  # the engine's int4 decode row takes it
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch.equal(cpu_gemv.int4_mv(x, w.packed, w.scales_and_zeros, group, block_n=w.block_n), ours)
    finally:
        torch.set_num_threads(before)
    assert not cpu_gemv.int4_mv_ok(torch.randn(2, k).bfloat16(), w.packed, w.scales_and_zeros, group)
    assert not cpu_gemv.int4_mv_ok(x.float(), w.packed, w.scales_and_zeros, group)


def _pack(codes: torch.Tensor, block_n: int) -> torch.Tensor:
    """torch's CPU int4 pack with block_n rows a block, written out by hand (torch picks 64 with AVX-512
    and 32 with AVX2 at run time, so one machine cannot make both)."""
    n, k = codes.shape
    b = codes.to(torch.uint8).reshape(n // block_n, block_n, k)
    return (b[:, : block_n // 2] | (b[:, block_n // 2 :] << 4)).transpose(1, 2).contiguous().view(n // 2, k)


@pytest.mark.parametrize("block_n", [64, 32])
def test_int4_pack_layouts(block_n):
    """Both of torch's layouts are recognised and read: expanded for many rows, one row in the C kernels,
    whose int8 loop gives the same bits for either layout."""
    from wslm.backend.quant.int4_dense import dequantize_packed, pack_block

    torch.manual_seed(block_n)
    n, k, group = 192, 256, 64
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    sz = torch.stack([torch.rand(k // group, n) * 0.02, torch.randn(k // group, n) * 0.02], -1).bfloat16()
    packed = _pack(codes, block_n)
    assert pack_block(packed, codes) == block_n
    if block_n == 64:
        native = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.int(), 1)
        assert pack_block(native, codes) in (64, 32)  # whichever this torch runs
    scale = sz[..., 0].float().t().repeat_interleave(group, 1)
    zero = sz[..., 1].float().t().repeat_interleave(group, 1)
    ref = (codes.float() - 8) * scale + zero
    dense = dequantize_packed(packed, sz, n, k, group, torch.float32, block_n)
    torch.testing.assert_close(dense, ref, rtol=2**-7, atol=1e-4)
    x = torch.randn(1, k).bfloat16()
    assert cpu_gemv.int4_mv_ok(x, packed, sz, group, block_n)
    exact = cpu_gemv.int4_mv(x, packed, sz, group, exact=True, block_n=block_n)
    torch.testing.assert_close(exact.float(), x.float() @ ref.T, rtol=2**-6, atol=2e-3)
    ours = cpu_gemv.int4_mv(x, packed, sz, group, block_n=block_n)
    other = cpu_gemv.int4_mv(x, _pack(codes, 96 - block_n), sz, group, block_n=96 - block_n)
    assert torch.equal(ours, other)  # the same sums whatever the layout
    assert not cpu_gemv.int4_mv_ok(x, packed, sz, group, 16)
    rows = torch.randn(5, k).bfloat16()  # a few rows at once: each one's bits, as one row alone gives them
    many = cpu_gemv.int4_mm(rows, packed, sz, group, block_n)
    assert torch.equal(many, torch.cat([cpu_gemv.int4_mv(r[None], packed, sz, group, block_n=block_n) for r in rows]))
    compiled = torch.compile(lambda t: cpu_gemv.int4_mm_op(t, packed, sz, group, block_n) * 2, fullgraph=True)
    assert torch.equal(compiled(rows), many * 2)  # the op form a compiled graph calls


@pytest.mark.skipif(cpu_gemv.library() is None, reason="no C compiler: the C kernels are not built")
def test_an_int8_head_gives_float32_logits_unrounded():
    """An int8 LM head's logits for a few rows come from the kernel's float32 sums: the bf16 product rounded
    them (demo: a mean KL of 0.0004 nats); rounded to bf16 they are exactly apply's result."""
    from wslm.backend.quant.int8 import Int8Weight
    from wslm.backend.quant.linear import head_logits

    torch.manual_seed(0)
    q = torch.randint(-127, 128, (4096, 576), dtype=torch.int8)
    w = Int8Weight(q, (torch.rand(4096) * 0.01).to(torch.bfloat16))
    exact_w = q.float() * w.scales.float()[:, None]
    for rows in (1, 3):
        x = torch.randn(rows, 576).to(torch.bfloat16)
        got = head_logits(x, w)
        assert got.dtype == torch.float32 and torch.equal(got.bfloat16(), w.apply(x))
        exact = x.float() @ exact_w.T
        assert float((got - exact).abs().max()) < 1e-3 < float((w.apply(x).float() - exact).abs().max())
        assert torch.equal(head_logits(x.float(), w), got)  # a float32 engine: the same row in bf16
    many = torch.randn(64, 576).to(torch.bfloat16)  # a big batch keeps the GEMM in the activations' dtype
    assert head_logits(many, w).dtype == torch.bfloat16


def test_a_head_asked_for_float32_gives_every_row_unrounded():
    """Steps that score prompt tokens (prompt_logprobs) ask the head for float32 logits however many rows:
    an int8 head and a dense bf16 head both expand their weight to float32 a slice at a time."""
    from wslm.backend.quant.int8 import Int8Weight
    from wslm.backend.quant.linear import head_logits

    torch.manual_seed(0)
    q = torch.randint(-127, 128, (5000, 64), dtype=torch.int8)  # more rows than one expanded slice
    w = Int8Weight(q, (torch.rand(5000) * 0.01).to(torch.bfloat16))
    dense = (q.float() * w.scales.float()[:, None]).to(torch.bfloat16)
    for rows in (3, 40, 200):
        x = torch.randn(rows, 64).to(torch.bfloat16)
        exact = x.double() @ (q.double() * w.scales.double()[:, None]).T
        got = head_logits(x, w, float32=True)
        assert got.dtype == torch.float32 and float((got.double() - exact).abs().max()) < 1e-5
        exact_dense = x.double() @ dense.double().T
        got_dense = head_logits(x, dense, float32=True)
        assert got_dense.dtype == torch.float32 and float((got_dense.double() - exact_dense).abs().max()) < 1e-5
        assert head_logits(x, dense).dtype == torch.bfloat16  # not asked: the product in the model's dtype


def test_prompt_logprobs_steps_ask_the_head_for_float32(demo_llm):
    from wslm.backend import SamplingParams

    model = demo_llm.llm_engine.executor.runner.model
    head, asked = model.lm_head, []

    def spy(hidden, float32=False):
        asked.append((hidden.shape[0], float32))
        return head(hidden, float32)

    model.lm_head = spy
    try:
        demo_llm.generate(["The capital of France is"], SamplingParams(max_tokens=2, prompt_logprobs=0))
        demo_llm.generate(["The capital of France is"], SamplingParams(max_tokens=2))
    finally:
        model.lm_head = head
    prefill_with, *_, prefill_without, _ = asked
    assert prefill_with[0] > 1 and prefill_with[1] is True
    assert prefill_without == (1, False)
