"""Bytes per weight once loaded, per storage format (what `wslm models` and the GUI's fits-in-GPU hint
count). Pure arithmetic: no torch, so the model list stays fast."""

from __future__ import annotations

from wslm import envs
from wslm.backend.quant.gguf_formats import BLOCK_FORMATS, INT4_TYPES, INT8_TYPES

# int4 groups of 32 with a bf16 scale and zero each: 4 + 32 / 32 bits.
INT4_GROUP32_BYTES = 0.625
INT8_BYTES = 1.0  # + one scale per row, negligible
DENSE_BYTES = 2.0  # 16-bit on a GPU (and on bf16-native CPUs)


def gguf_runtime_bytes(elements_by_type: dict[str, int]) -> int:
    """Resident bytes of a GGUF's weights as the engine keeps them (gguf_weights.py's mapping): the file's own
    bytes for the block types a CPU engine computes in place (WSLM_GGUF_BLOCKS, on by default: mapped pages,
    resident once read; GPU engines still repack them, to within ~20% of this), else the repacked forms'."""
    total = 0.0
    blocks = envs.WSLM_GGUF_BLOCKS  # in place unless WSLM_GGUF_BLOCKS=0
    for kind, n in elements_by_type.items():
        if blocks and kind in BLOCK_FORMATS:
            _, cols, size = BLOCK_FORMATS[kind]
            total += n * size / cols
        elif kind in INT4_TYPES:
            total += n * INT4_GROUP32_BYTES
        elif kind in INT8_TYPES:
            total += n * INT8_BYTES
        elif kind == "F32":
            total += n * 4.0 if n < 1 << 20 else n * DENSE_BYTES  # norms stay fp32; big tensors go 16-bit
        else:
            total += n * DENSE_BYTES
    return int(total)
