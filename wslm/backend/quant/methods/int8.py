"""`quantization="int8"`: a 16-bit checkpoint's weights quantized while loading, int8 per output channel
(quant/int8.py)."""

from __future__ import annotations

from wslm.backend.quant.method import QuantMethod
from wslm.backend.quant.registry import register_method


class Int8Method(QuantMethod):
    name = "int8"
    description = "16-bit weights quantized at load, int8 per output channel"
    label = "int8 (quantize while loading)"
    weight_kinds = ("int8",)
    on_the_fly = True

    def quantize(self, weight, is_table=False, group_width=None):
        from wslm.backend.quant.int8 import quantize_int8

        return quantize_int8(weight)


METHOD = register_method(Int8Method(), {"int8": ("wslm.backend.quant.int8", "Int8Weight")})
