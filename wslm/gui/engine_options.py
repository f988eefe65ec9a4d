"""The engine options the Server panel offers as fields (vLLM's flag names): which values fit the chosen
model and the target, checked before a start so a wrong choice is a message, not a crashed server."""

from __future__ import annotations

from wslm.tp_sizes import model_facts, tensor_parallel_sizes

# (label, --quantization value; "" = not passed: the checkpoint's own format). What the GUI offers before the
# backend has answered; each `models list` entry then carries the values its weight format accepts
# (quantization_options, from the backend's format registry), and formats registered there join the list.
QUANTIZATIONS = [
    ("auto (the model's own)", ""),
    ("int8 (quantize while loading)", "int8"),
    ("int4 (quantize while loading)", "int4"),
    ("AWQ", "awq"),
    ("GPTQ", "gptq"),
    ("GGUF", "gguf"),
]
# fp8 runs on CPU and on NVIDIA cards of compute capability 8.9+ (RTX 40, H100); the engine names older cards.
KV_CACHE_DTYPES = [("auto (the model's dtype)", "auto"), ("fp8 (twice the tokens in the same memory)", "fp8")]


def model_format(model: dict | None) -> tuple[str, str]:
    """(format, pre-quantization) of an installed model: ("gguf", "Q4_K_M"), ("hf", "awq"), ("hf", "")."""
    if not model:
        return "", ""
    fmt = str(model.get("format") or "")
    quant = str(model.get("quantization") or "").lower()
    return fmt, quant


def quantization_choices(models: list[dict] | None) -> list[tuple[str, str]]:
    """QUANTIZATIONS and, after them, the formats the backend's models list offers that it lacks."""
    choices = list(QUANTIZATIONS)
    known = {value for _, value in choices}
    for model in models or []:
        for option in model.get("quantization_options") or []:
            value = str(option.get("value") or "")
            if value not in known:
                known.add(value)
                choices.append((str(option.get("label") or value), value))
    return choices


def check_quantization(choice: str, model: dict | None) -> str:
    """"" when `choice` fits the model, else what to change: the model's own quantization_options (its weight
    format's answer) where the backend lists them, else the rule for backends that do not."""
    if not choice or model is None:
        return ""
    options = model.get("quantization_options")
    if options:
        allowed = {str(o.get("value") or ""): str(o.get("label") or o.get("value") or "") for o in options}
        if choice in allowed:
            return ""
        names = [label for value, label in allowed.items() if value]
        return (f"This model does not take quantization {choice!r}: pick auto"
                + (f" or {', '.join(names)}." if names else "."))
    fmt, quant = model_format(model)
    if fmt == "gguf":
        return "" if choice == "gguf" else (
            "This model is a GGUF file: it runs in its own quantization. Set Quantization to auto.")
    prequantized = next((q for q in ("awq", "gptq") if q in quant), "")
    if prequantized:
        return "" if choice == prequantized else (
            f"This checkpoint is already {prequantized.upper()}-quantized: set Quantization to auto.")
    if choice in ("awq", "gptq", "gguf"):
        return f"This model is not a {choice.upper()} checkpoint: pick auto, int8 or int4."
    return ""


def check_kv_cache_dtype(choice: str, has_gpu: bool | None) -> str:
    if choice not in {value for _, value in KV_CACHE_DTYPES}:
        return f"KV cache dtype {choice!r} is not one wslm runs: pick auto or fp8."
    return ""


def fitting_tp_sizes(gpu_count: int, model: dict | None) -> list[int]:
    """The sizes up to the GPU count that the engine accepts for this `models list` entry (one rule:
    wslm.tp_sizes, which the engine's start-up check applies too)."""
    return tensor_parallel_sizes(gpu_count, **model_facts(model))


def check_tensor_parallel(size: int, gpu_count: int, model: dict | None) -> str:
    if size <= 1:
        return ""
    sizes = fitting_tp_sizes(gpu_count, model)
    if size not in sizes:
        return (f"Tensor parallel size {size} does not fit: this target has {gpu_count} GPU(s) and the model "
                f"splits evenly over {', '.join(map(str, sizes))}.")
    return ""
