"""The front end's check of a request's adapter, before it is queued: a LoRARequest, LoRA enabled, its folder
a PEFT LoRA adapter within max_lora_rank whose tensors fit the model (layer count and projection shapes), so
that a bad adapter is the request's 400, never a failed engine step. Remembered per lora_int_id, so a folder
is read once."""

from __future__ import annotations

from typing import Any

from wslm.backend.errors import RequestError
from wslm.backend.loader.lora import check_adapter, load_adapter
from wslm.backend.lora.request import LoRARequest


def projection_shapes(mc: Any) -> dict[str, tuple[int, int]]:
    """(out, in) of each PEFT target of a decoder layer, from the model config (empty when unknown)."""
    try:
        hidden, inner = mc.hidden_size, mc.intermediate_size
        q, kv = mc.num_heads * mc.head_dim, mc.num_kv_heads * mc.head_dim
    except (AttributeError, TypeError):
        return {}
    return {"q_proj": (q, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden), "qkv_proj": (q + 2 * kv, hidden),
            "o_proj": (hidden, q), "gate_proj": (inner, hidden), "up_proj": (inner, hidden),
            "gate_up_proj": (2 * inner, hidden), "down_proj": (hidden, inner)}


class AdapterChecker:
    def __init__(self, enabled: bool, max_lora_rank: int, model_config: Any = None) -> None:
        self.enabled = enabled
        self.max_lora_rank = max_lora_rank
        self.num_layers = getattr(model_config, "num_layers", None)
        self.shapes = projection_shapes(model_config) if model_config is not None else {}
        self._ok: dict[int, str] = {}  # lora_int_id -> the path checked

    def __call__(self, req: object) -> None:
        if not isinstance(req, LoRARequest):
            raise RequestError(f"lora_request must be a LoRARequest(lora_name, lora_int_id, lora_path), got "
                               f"{type(req).__name__}", param="lora_request")
        if not self.enabled:
            raise RequestError("This engine serves no LoRA adapters: start it with enable_lora=True "
                               "(`wslm serve --enable-lora`)", param="lora_request")
        if self._ok.get(req.lora_int_id) == req.lora_path:
            return
        try:
            check_adapter(req.lora_path, self.max_lora_rank)
            self._check_tensors(req.lora_path)
        except (ValueError, OSError) as exc:
            raise RequestError(f"LoRA adapter {req.lora_name!r}: {exc}", param="lora_request",
                               code="invalid_lora") from exc
        self._ok[req.lora_int_id] = req.lora_path

    def _check_tensors(self, path: str) -> None:
        adapter = load_adapter(path)
        for (layer, _, target), (a, b) in adapter.pairs.items():
            if self.num_layers is not None and layer >= self.num_layers:
                raise ValueError(f"the adapter has layer {layer}; the model has {self.num_layers} layers (an adapter "
                                 "for another model?)")
            want = self.shapes.get(target)
            got = (b.shape[0], a.shape[1])
            if want is not None and (got != want or a.shape[0] != b.shape[1]):
                raise ValueError(f"layer {layer} {target} is {got[0]} x {got[1]} in the adapter, {want[0]} x "
                                 f"{want[1]} in the model (an adapter for another model?)")
