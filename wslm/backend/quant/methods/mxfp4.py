"""gpt-oss's MXFP4 experts (`quant_method: "mxfp4"`): not a --quantization choice; the model's own code
dequantizes them on load (modeling/models/gpt_oss.py), so the checkpoint runs as a 16-bit one (int8 / int4
may be asked on top)."""

from __future__ import annotations

from wslm.backend.quant.method import QuantMethod
from wslm.backend.quant.registry import DENSE, register_method


class MXFP4Method(QuantMethod):
    name = "mxfp4"
    description = "gpt-oss MXFP4 experts, dequantized on load"
    listed = False
    prequantized = True
    checkpoint_names = ("mxfp4",)

    def resolve(self, requested: QuantMethod | None) -> str | None:
        return requested.name if requested is not None and requested.on_the_fly else None

    def choices(self) -> tuple[str, ...]:
        return DENSE.choices()


METHOD = register_method(MXFP4Method())
