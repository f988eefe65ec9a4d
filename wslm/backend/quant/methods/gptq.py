"""GPTQ checkpoints (`quant_method: "gptq"`, AutoGPTQ / GPTQModel): 4-bit, repacked to int4 at load
(quant/gptq.py). int8 too: an act-order checkpoint's column shards under tensor parallelism (shard.py)."""

from __future__ import annotations

from wslm.backend.quant.methods.packed import PackedInt4Method
from wslm.backend.quant.registry import register_method


class GPTQMethod(PackedInt4Method):
    name = "gptq"
    description = "GPTQ safetensors repacked to int4"
    label = "GPTQ"
    checkpoint_names = ("gptq",)
    weight_kinds = ("int4", "int8")

    def parts_complete(self, parts: dict) -> bool:
        return super().parts_complete(parts) and "g_idx" in parts

    def parts_enough(self, parts: dict) -> bool:
        return super().parts_complete(parts)

    def to_codes(self, parts: dict, quant_config: dict):
        from wslm.backend.quant import gptq

        # The original GPTQ format stores each zero point minus one; gptq_v2 stores it as is.
        offset = 0 if str(quant_config.get("checkpoint_format", "gptq")).lower() == "gptq_v2" else 1
        return gptq.to_codes(parts, self.group_size(quant_config), offset)


METHOD = register_method(GPTQMethod())
