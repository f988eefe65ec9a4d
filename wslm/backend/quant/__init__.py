"""Quantized weights kept quantized: one file per format, all repacked at load into two runtime forms
(int8 per output channel, int4 asymmetric groups) that torch's own kernels multiply (linear.py).

- int8.py / int4.py: the runtime weights and their kernels, plus on-the-fly quantization of 16-bit weights
  (`quantization="int8" | "int4"`);
- registry.py: each format's method object and the runtime weight kinds (callers never switch on a weight's
  class: the weights carry the hooks the decode paths ask);
- gguf_weights.py: GGUF tensors read one at a time and repacked (Q4_0/Q4_1/Q4_K exactly to int4, the
  other types to int8 — never fewer bits than the source);
- awq.py / gptq.py: AutoAWQ (GEMM) and GPTQ safetensors checkpoints repacked to int4."""

from __future__ import annotations

from wslm.backend.quant.registry import METHODS, QuantMethod, get_method

__all__ = ["METHODS", "QUANTIZATION_METHODS", "QuantMethod", "check_quantization", "get_method"]

# vLLM's names for LLM(quantization=...) / --quantization: every registered format but dense.
QUANTIZATION_METHODS = tuple(name for name in METHODS if name is not None)


def check_quantization(name: str | None) -> str | None:
    if name is None or name in ("", "none", "None"):
        return None
    if name not in QUANTIZATION_METHODS:
        raise ValueError(
            f"quantization must be one of {', '.join(QUANTIZATION_METHODS)} (or unset), got {name!r}."
        )
    return name
