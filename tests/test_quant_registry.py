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
HOOKS = ("apply", "dequantize", "kernel")


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
    # Built-in first, in vLLM's order (formats of one's own, tests/toy_format.py, come after them).
    assert tuple(QUANTIZATION_METHODS)[:5] == ("gguf", "awq", "gptq", "int8", "int4")
    # gpt-oss's MXFP4 is read (dequantized on load) but is not a choice.
    assert set(METHODS) == {*QUANTIZATION_METHODS, "mxfp4", None} and not METHODS["mxfp4"].listed
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


# The files issue 36 names as readers of the registry: none of them branches on a format's name.
READERS = ["backend/loader", "backend/quant/shard.py", "tp_sizes.py", "backend/config.py", "backend/hub",
           "backend/quant/linear.py", "backend/quant/packed_checkpoint.py"]


def test_readers_ask_the_registry_not_format_names():
    names = "|".join(n for n in QUANTIZATION_METHODS if n != "gguf")  # "gguf" is also the hub's file type
    pattern = re.compile(rf"""(==|!=|\bin)\s*[(\[{{]?[^\n#]*["']({names})["']""")
    files = [p for r in READERS for p in ((ROOT / r).rglob("*.py") if (ROOT / r).is_dir() else [ROOT / r])]
    offenders = [
        f"{path.relative_to(ROOT.parent)}:{n}: {line.strip()}"
        for path in files
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line.split("#")[0])
    ]
    assert not offenders, f"ask the format's QuantMethod (quant/registry.py) instead: {offenders}"


def test_detect_and_resolve():
    from wslm.backend.quant.registry import checkpoint_group, detect_method, quantization_options, resolve

    gguf, awq = get_method("gguf"), get_method("awq")
    assert detect_method(None, "m.Q4_K_M.gguf") is gguf and detect_method({"quant_method": "AWQ"}) is awq
    assert detect_method(None) is None and detect_method({"quant_method": "mxfp4"}).name == "mxfp4"
    with pytest.raises(ValueError, match="quantized with 'bitsandbytes' are not supported"):
        detect_method({"quant_method": "bitsandbytes"})
    assert resolve(None, gguf) == "gguf" and resolve("int8", gguf) == "int8" and resolve("awq", gguf) == "gguf"
    assert resolve(None, awq, {"bits": 4}) == "awq" and resolve("int4", None) == "int4"
    assert resolve("int8", detect_method({"quant_method": "mxfp4"})) == "int8"
    with pytest.raises(ValueError, match="cannot apply"):
        resolve("int8", awq, {})
    with pytest.raises(ValueError, match="8-bit weights"):
        resolve(None, get_method("gptq"), {"bits": 8})
    with pytest.raises(ValueError, match="has no awq weights"):
        resolve("awq", None)
    assert checkpoint_group("gguf") == 32 and checkpoint_group("gptq", {"group_size": 64}) == 64
    assert [o["value"] for o in quantization_options(None)] == ["", "int8", "int4"]
    assert [o["value"] for o in quantization_options(awq)] == ["", "awq"]
