"""The quantization registry: every format has its method object, and only wslm.backend.quant knows the
runtime weight classes (issue 23)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from wslm.backend.quant import QUANTIZATION_METHODS, check_quantization
from wslm.backend.quant.registry import DENSE, METHODS, QuantMethod, get_method, weight_class, weight_kind

ROOT = Path(__file__).resolve().parents[1] / "wslm"
QUANT = ROOT / "backend" / "quant"
HOOKS = ("apply", "dequantize", "decode_rows", "decode_row_limit", "c_kernel", "c_view", "graph_spec")


@pytest.mark.parametrize("name", [*QUANTIZATION_METHODS, None])
def test_every_format_has_a_method(name):
    method = get_method(check_quantization(name))
    assert isinstance(method, QuantMethod) and method.name == name
    assert method.on_the_fly != method.prequantized or method is DENSE
    for kind in method.weight_kinds:
        cls = weight_class(kind)
        assert cls.kind == kind
        for hook in HOOKS:
            assert callable(getattr(cls, hook)), (kind, hook)


def test_method_names():
    assert QUANTIZATION_METHODS == ("gguf", "awq", "gptq", "int8", "int4")
    assert set(METHODS) == {*QUANTIZATION_METHODS, None}
    assert check_quantization("none") is None
    with pytest.raises(ValueError, match="quantization must be one of gguf, awq, gptq, int8, int4"):
        check_quantization("fp8")


def test_weight_kind():
    from wslm.backend.quant.int4 import quantize_int4
    from wslm.backend.quant.int8 import quantize_int8

    w = torch.randn(32, 64)
    assert weight_kind(w) == "dense"
    assert weight_kind(quantize_int8(w)) == "int8"
    assert weight_kind(quantize_int4(w, 32)) == "int4"


def test_no_class_switch_outside_quant():
    pattern = re.compile(r"isinstance\([^\n]*\b(Int4Weight|Int8Weight|Int4Codes)\b")
    offenders = [
        f"{path.relative_to(ROOT.parent)}:{n}"
        for path in ROOT.rglob("*.py")
        if QUANT not in path.parents
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert not offenders, f"switch on the weight's kind or hooks instead (quant/registry.py): {offenders}"
