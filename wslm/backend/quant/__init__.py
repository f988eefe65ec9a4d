"""Quantized weights kept quantized: one file per format (methods/*.py, each a QuantMethod registered with
registry.register_method; a format of one's own is one such file anywhere), loaded into runtime forms that
carry their own kernels (int8 per output channel, int4 asymmetric groups, GGUF blocks; linear.py calls them).

- method.py / registry.py: what a format answers (detect from a checkpoint, iterate its tensors, group size
  under tensor parallelism, its --quantization name, the GUI's options) and the one table the rest asks
  (callers never switch on a format's name or a weight's class: the weights carry the hooks the decode
  paths ask);
- int8.py / int4.py: the runtime weights and their kernels, plus on-the-fly quantization of 16-bit weights
  (`quantization="int8" | "int4"`);
- gguf_weights.py: GGUF tensors read one at a time and repacked (Q4_0/Q4_1/Q4_K exactly to int4, the
  other types to int8 — never fewer bits than the source);
- awq.py / gptq.py: AutoAWQ (GEMM) and GPTQ safetensors checkpoints repacked to int4."""

from __future__ import annotations

from wslm.backend.quant.registry import METHODS, QuantMethod, get_method, method_names, register_method

__all__ = ["METHODS", "QUANTIZATION_METHODS", "QuantMethod", "check_quantization", "get_method", "method_names",
           "register_method"]

# vLLM's names for LLM(quantization=...) / --quantization: every listed format (a live view of the registry).
QUANTIZATION_METHODS = method_names()


def check_quantization(name: str | None) -> str | None:
    if name is None or name in ("", "none", "None"):
        return None
    if name not in QUANTIZATION_METHODS:
        raise ValueError(
            f"quantization must be one of {', '.join(QUANTIZATION_METHODS)} (or unset), got {name!r}."
        )
    return name
