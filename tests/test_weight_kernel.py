"""One kernel interface for every weight format (quant/kernel.py, issue 33 item 4): each runtime weight
describes its layout, buffers and sizes as a WeightKernel, whose `mm` is the very product its own apply runs
for few rows; a format without one is described by a reason; the CPU decode back ends read the family's
decode_layers() specs and these descriptions, never one another's state nor a format's own hooks."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from toy_format import RowmaxWeight

from wslm.backend.quant.int4 import quantize_int4
from wslm.backend.quant.int8 import quantize_int8
from wslm.backend.quant.kernel import LAYOUTS, WeightKernel, weight_kernel

ROOT = Path(__file__).resolve().parents[1] / "wslm"
CPU = ROOT / "backend" / "platforms" / "cpu"


def test_each_format_describes_its_layout():
    torch.manual_seed(0)
    w = torch.randn(64, 128)
    dense = weight_kernel(w.to(torch.bfloat16))
    assert isinstance(dense, WeightKernel) and dense.layout == "dense" and (dense.n, dense.k) == (64, 128)
    assert dense.dtype == torch.bfloat16 and dense.c_kernel

    q8 = quantize_int8(w)
    k8 = weight_kernel(q8)
    assert k8.layout == "int8" and (k8.n, k8.k) == (64, 128) and k8.dtype == q8.scales.dtype
    assert k8.buffers["qweight"] is q8.qweight and k8.buffers["scales"] is q8.scales

    q4 = quantize_int4(w, 32, torch.device("cpu"))
    k4 = weight_kernel(q4)
    assert k4.layout == "int4" and k4.group == 32 and "perm" not in k4.buffers
    assert k4.buffers["packed"] is q4.packed and k4.block == q4.block_n
    assert {k.layout for k in (dense, k8, k4)} <= set(LAYOUTS)

    for q, k in ((q8, k8), (q4, k4)):  # mm is apply's own product for few rows: the same bits
        x = torch.randn(3, 128).to(k.dtype)
        assert 3 < k.mm_rows and torch.equal(k.mm(x), q.apply(x))


def test_a_format_without_a_layout_is_described_by_a_reason():
    reason = weight_kernel(RowmaxWeight.quantize(torch.randn(8, 32)))
    assert isinstance(reason, str) and "RowmaxWeight" in reason


def test_back_ends_read_specs_and_kernels_not_each_other():
    # (?<!cpu): platforms/cpu/decode_rows.py is a module (a lone chat's verification rows), not the old hook
    hooks = re.compile(r"(?<!cpu)\.(decode_rows|decode_row_limit|c_view|graph_spec|graph_form|source_weight)\b|\.c_kernel\(")
    offenders = [f"{p.relative_to(ROOT.parent)}:{n}" for p in ROOT.rglob("*.py")
                 for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if hooks.search(line)]  # fmt: skip
    assert offenders == []
    for name in ("decode_native.py", "decode_compiled.py"):
        text = (CPU / name).read_text(encoding="utf-8")
        imports = [line for line in text.splitlines() if re.match(r"\s*(from|import) ", line)]
        assert not any("decode_eager" in line for line in imports) and "cpu_decode" not in text, name
        assert any("decode_specs" in line for line in imports), name
