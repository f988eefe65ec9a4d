"""The tiled block GEMM for many activation rows (kernels/cpu_gguf_gemm.c): for every GGUF block type each
output row equals the block GEMV's (cpu_gguf.c, one row at a time) within float32 rounding, and both equal
gguf-py's dequantization times the int8-rounded row; a row's bits do not depend on the batch it came in or
the thread count; fused, permuted weights of mixed types; the build without AVX2."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_testing import random_gguf_blocks  # noqa: E402

from wslm.backend.quant.gguf_blocks import (  # noqa: E402
    BLOCK_TYPES,
    BLOCKS,
    PREFILL_ROWS,
    TYPE_IDS,
    GGUFBlockWeight,
    dequantize_reference,
)

ROUNDING = 2.0**-20  # float32 sums of a few hundred terms, relative to sum |w| |x|
N, M = 71, 37  # odd: last tiles of fewer weight rows and fewer activation rows


def _cols(kind: str) -> int:
    # several blocks; 25 32-column blocks leave a tail after the minimums' 8-block vectors
    return 768 if BLOCKS[TYPE_IDS[kind]][1] == 256 else 800


def _weight(kind: str, rows: int = N, seed: int = 0) -> GGUFBlockWeight:
    k = _cols(kind)
    return GGUFBlockWeight([(TYPE_IDS[kind], random_gguf_blocks(rows, k, kind, seed=seed).contiguous())], k)


def _x(rows: int, k: int, seed: int = 1) -> torch.Tensor:
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(seed))
    x[2] *= 50  # rows of other magnitudes
    x[3, :40] = 0  # a block of zeros (scale 0)
    return x


def _gemv_rows(w: GGUFBlockWeight, x: torch.Tensor, out_dtype=None) -> torch.Tensor:
    """The block GEMV, one activation row a call (below the GEMM's MIN_ROWS)."""
    from wslm.kernels import cpu_gguf

    return torch.cat([cpu_gguf.mm(x[j : j + 1].contiguous(), w.c_struct(), out_dtype) for j in range(x.shape[0])])


def _scale(w: GGUFBlockWeight, x: torch.Tensor, kind: str) -> torch.Tensor:
    from wslm.kernels import cpu_gguf

    xr = torch.stack([cpu_gguf.round_x(row, BLOCKS[TYPE_IDS[kind]][1]) for row in x]).double()
    ref = dequantize_reference(w.parts[0][1], w.parts[0][0]).double()
    return xr.abs() @ ref.abs().t(), xr @ ref.t()


@pytest.mark.parametrize("kind", BLOCK_TYPES)
def test_gemm_equals_block_gemv_per_row(kind):
    from wslm.kernels import cpu_gguf_gemm

    assert cpu_gguf_gemm.library() is not None, "the C kernels did not build here"
    w = _weight(kind)
    x = _x(M, _cols(kind))
    s = w.c_struct()
    assert cpu_gguf_gemm.takes(s)
    out = cpu_gguf_gemm.mm(x, s)
    one = _gemv_rows(w, x)
    scale, exact = _scale(w, x, kind)
    assert ((out.double() - one.double()).abs() / scale).max().item() <= 2 * ROUNDING, kind
    assert ((out.double() - exact).abs() / scale).max().item() <= ROUNDING, kind
    # bf16 rows in, bf16 out: the same sums rounded once
    bf = x.bfloat16()
    out_bf = cpu_gguf_gemm.mm(bf, s)
    assert out_bf.dtype == torch.bfloat16
    ref_bf = cpu_gguf_gemm.mm(bf, s, torch.float32)
    torch.testing.assert_close(out_bf.float(), ref_bf, rtol=2**-8, atol=0)
    assert ((ref_bf.double() - _gemv_rows(w, bf, torch.float32).double()).abs() / scale).max().item() <= 2**-18


@pytest.mark.parametrize("kind", ("Q4_0", "Q8_0", "Q4_K", "Q6_K"))
def test_a_rows_bits_do_not_depend_on_batch_or_threads(kind):
    from wslm.kernels import cpu_gguf_gemm

    w = _weight(kind, rows=67)
    x = _x(M, _cols(kind), seed=3)
    s = w.c_struct()
    whole = cpu_gguf_gemm.mm(x, s, threads=2)
    assert torch.equal(cpu_gguf_gemm.mm(x, s, threads=1), whole)
    assert torch.equal(cpu_gguf_gemm.mm(x[5:22].contiguous(), s, threads=1), whole[5:22])  # other tiles
    # more rows than one block of activation rows (GG_MBLOCK 128): the same bits in every block
    big = torch.cat([x] * 8)
    assert torch.equal(cpu_gguf_gemm.mm(big, s, threads=2), torch.cat([whole] * 8))


def test_fused_permuted_mixed_types_through_apply():
    """q/k rows permuted as llama.cpp stores them, fused with a v of another type; apply() from MIN_ROWS
    rows (and from the old PREFILL_ROWS) is the GEMM, in HF's row order, equal to the GEMV per row."""
    from wslm.backend.quant.gguf_weights import _unpermute_rows
    from wslm.backend.quant.linear import fuse_rows
    from wslm.kernels import cpu_gguf_gemm

    k = 512
    kinds = ("Q4_K", "Q4_0", "Q6_K")
    parts = [GGUFBlockWeight([(TYPE_IDS[kd], random_gguf_blocks(64, k, kd, seed=7 + i).contiguous())], k)
             for i, kd in enumerate(kinds)]  # fmt: skip
    q_rows, k_rows = _unpermute_rows(64, 4), _unpermute_rows(64, 2)
    fused = fuse_rows([parts[0].take_rows(q_rows), parts[1].take_rows(k_rows), parts[2]])
    assert fused.kind == "gguf" and fused.types == kinds and fused.index is not None
    dense = fused.dequantize().double()
    for rows in (cpu_gguf_gemm.MIN_ROWS + 1, PREFILL_ROWS + 1):
        x = _x(rows, k, seed=rows)
        out = fused.apply(x)
        assert torch.equal(out, cpu_gguf_gemm.mm(x, fused.c_struct()))
        one = _gemv_rows(fused, x)
        scale = x.double().abs() @ dense.abs().t()
        assert ((out.double() - one.double()).abs() / scale).max().item() <= 2 * ROUNDING


def test_plain_c_build_gives_the_same_products(tmp_path):
    """The build without AVX2 (the plain loops a CPU without it runs): the same contract."""
    script = textwrap.dedent(
        """
        import json, sys, torch
        sys.path.insert(0, sys.argv[1])
        import test_gguf_gemm as t
        from wslm.kernels import cpu_gguf_gemm
        assert cpu_gguf_gemm.native() == 0
        errs = {}
        for kind in t.BLOCK_TYPES:
            w = t._weight(kind, rows=9)
            x = t._x(17, t._cols(kind))
            out = cpu_gguf_gemm.mm(x, w.c_struct())
            scale, exact = t._scale(w, x, kind)
            errs[kind] = max(((out.double() - exact).abs() / scale).max().item(),
                             ((out.double() - t._gemv_rows(w, x).double()).abs() / scale).max().item() / 2)
        print(json.dumps(errs))
        """
    )
    env = dict(os.environ, WSLM_CPU_KERNELS_CFLAGS="-march=x86-64 -mtune=generic", XDG_CACHE_HOME=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", script, os.path.dirname(__file__)], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    errs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(errs) == set(BLOCK_TYPES) and max(errs.values()) <= ROUNDING, errs
