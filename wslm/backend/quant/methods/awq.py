"""AutoAWQ GEMM checkpoints (`quant_method: "awq"`): 4-bit, repacked to int4 at load (quant/awq.py)."""

from __future__ import annotations

from wslm.backend.quant.methods.packed import PackedInt4Method
from wslm.backend.quant.registry import register_method


class AWQMethod(PackedInt4Method):
    name = "awq"
    description = "AutoAWQ GEMM safetensors repacked to int4"
    label = "AWQ"
    checkpoint_names = ("awq",)

    def check_checkpoint(self, quant_config: dict) -> None:
        super().check_checkpoint(quant_config)
        version = str(quant_config.get("version") or "gemm").lower()
        if version != "gemm":
            raise ValueError(f"This AWQ checkpoint is packed as {version!r}; wslm reads AWQ's GEMM packing only. "
                             "Use a GEMM build of the model (the usual one on the hub) or a GGUF.")

    def to_codes(self, parts: dict, quant_config: dict):
        from wslm.backend.quant import awq

        return awq.to_codes(parts, self.group_size(quant_config))


METHOD = register_method(AWQMethod())
