"""Bytes a loaded model's weights take on its device, in the format they are kept (dense or quantized):
what one tensor-parallel rank holds, for the tests' 1/N check and bench/tp.py."""

from __future__ import annotations

import torch


def weight_bytes(model) -> dict[str, int]:
    """{"layers": decoder layers' weights, "vocab": embedding + LM head (once when tied)}. Rotary tables are
    derived, not weights, and are left out."""
    seen: set[int] = set()
    vocab = _walk(model.embed_tokens, seen) + _walk(model.lm_head, seen)
    return {"layers": _walk(model.layers, seen), "vocab": vocab}


def _walk(obj, seen: set[int]) -> int:
    if id(obj) in seen or obj is None or isinstance(obj, (str, int, float, bool, torch.device, torch.dtype)):
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if hasattr(obj, "nbytes") and hasattr(obj, "apply"):  # a quantized weight (quant/int8.py, int4.py)
        return int(obj.nbytes)
    if isinstance(obj, (list, tuple)):
        return sum(_walk(x, seen) for x in obj)
    if isinstance(obj, dict):
        return sum(_walk(x, seen) for x in obj.values())
    fields = getattr(obj, "__dict__", None)
    if fields is None:
        return 0
    return sum(_walk(v, seen) for k, v in fields.items() if k != "rotary_emb")
