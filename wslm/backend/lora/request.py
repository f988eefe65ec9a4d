"""LoRARequest: which adapter a request runs with (vLLM's vllm.lora.request.LoRARequest)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """lora_name: the adapter's name (what a server lists); lora_int_id: a positive id, unique per adapter
    (the engine keys its resident weights and the prefix cache on it); lora_path: the PEFT folder
    (adapter_config.json + adapter_model.safetensors or .bin)."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be a positive whole number, got {self.lora_int_id!r}")
        if not self.lora_path:
            raise ValueError(f"LoRARequest {self.lora_name!r} needs lora_path: the adapter's PEFT folder")

    # vLLM's older names.
    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path

    @property
    def lora_local_path(self) -> str:
        return self.lora_path
