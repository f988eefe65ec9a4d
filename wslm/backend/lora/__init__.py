"""LoRA adapters served per request over one shared base (vLLM's way): `LoRARequest` names the adapter a
request runs with; the worker keeps each resident adapter's A and B beside the base's linear layers
(weights.py, layers.py, manager.py) and adds every request's own delta in the same batched step."""

from wslm.backend.lora.request import LoRARequest

__all__ = ["LoRARequest"]
