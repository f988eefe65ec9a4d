"""`quantization="int4"`: a 16-bit checkpoint's weights quantized while loading, int4 groups of up to 128
(quant/int4.py); embedding / lm_head tables and widths int4 groups do not divide go to int8."""

from __future__ import annotations

from wslm.backend.quant.method import QuantMethod
from wslm.backend.quant.registry import register_method


class Int4Method(QuantMethod):
    name = "int4"
    description = "16-bit weights quantized at load, int4 groups of up to 128"
    label = "int4 (quantize while loading)"
    weight_kinds = ("int4", "int8")
    on_the_fly = True

    def quantize(self, weight, is_table=False, group_width=None):
        """Groups of 128, or the largest of 64/32 that divides group_width (the input width, or one rank's
        share of it). Tables go to int8: their rows are read one by one, and 4-bit logits cost the most."""
        from wslm.backend.quant.int4 import pick_group_size, quantize_int4_codes
        from wslm.backend.quant.int8 import quantize_int8

        width = group_width or weight.shape[1]
        if is_table or width % 32:
            return quantize_int8(weight)
        return quantize_int4_codes(weight, pick_group_size(width, 128))


METHOD = register_method(Int4Method(), {"int4": ("wslm.backend.quant.int4", "Int4Weight")})
