"""One GGUF tensor's raw data in the runtime form the repacking path keeps: dense, int4 codes (Q4_0, Q4_1,
Q4_K) or int8 rows (the rest). Shared by gguf_weights.py (the load) and gguf_blocks.py (blocks handed to a
back end that multiplies the repacked forms), with no import of either."""

from __future__ import annotations

import numpy as np
import torch

from wslm.backend.quant.gguf_formats import DENSE_TYPES, INT4_TYPES, INT8_TYPES
from wslm.backend.quant.int4 import Int4Codes
from wslm.backend.quant.int8 import quantize_int8_chunks

_ROWS_PER_CHUNK = 1024


def convert_tensor(data, qtype, shape: tuple[int, ...], dequant: bool | str, is_table: bool, name: str):
    """One tensor's raw GGUF data (a whole tensor, or one expert's rows of a stacked one) in its runtime
    form. dequant: dequantize_mode's answer."""
    import gguf

    kind = qtype.name
    if kind in DENSE_TYPES:
        arr = np.asarray(data)
        if kind == "BF16":
            tensor = torch.from_numpy(arr.view(np.int16).copy()).view(torch.bfloat16)
        else:
            tensor = torch.from_numpy(arr.copy())
        return tensor.reshape(shape)
    if dequant is True:
        return torch.from_numpy(gguf.quants.dequantize(data, qtype).reshape(shape))
    if kind in INT4_TYPES and not is_table:
        return _int4_codes(np.asarray(data), kind, shape)
    if kind not in INT4_TYPES + INT8_TYPES:
        raise ValueError(
            f"GGUF tensor {name} is {kind}, which wslm cannot load yet (supported: "
            f"{', '.join(DENSE_TYPES + INT4_TYPES + INT8_TYPES)}). Pick a file with one of these types."
        )
    if dequant == "exact":  # int8 per row would re-quantize these
        return torch.from_numpy(gguf.quants.dequantize(data, qtype).reshape(shape))
    data = np.asarray(data).reshape(shape[0], -1)  # one row of blocks per weight row
    chunks = (
        torch.from_numpy(gguf.quants.dequantize(data[i : i + _ROWS_PER_CHUNK], qtype).reshape(-1, shape[1]))
        for i in range(0, shape[0], _ROWS_PER_CHUNK)
    )
    return quantize_int8_chunks(chunks, shape, torch.device("cpu"))


def _f16(a: np.ndarray) -> np.ndarray:
    return a.copy().view(np.float16).astype(np.float32)


def _int4_codes(raw: np.ndarray, kind: str, shape: tuple[int, int]) -> Int4Codes:
    """The 4-bit codes and per-32 (scale, zero) of Q4_0/Q4_1/Q4_K blocks, in tinygemm's convention
    w = (q - 8) * scale + zero."""
    n, k = shape
    if kind in ("Q4_0", "Q4_1"):
        block = 18 if kind == "Q4_0" else 20
        b = raw.reshape(n, k // 32, block)
        d = _f16(b[..., 0:2])[..., 0]
        qs = b[..., block - 16 :]
        # Element j of a block is the low nibble of byte j, element j + 16 the high nibble.
        codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
        zero = np.zeros_like(d) if kind == "Q4_0" else _f16(b[..., 2:4])[..., 0] + 8.0 * d
        return _codes(codes.reshape(n, k), d, zero)
    # Q4_K: super-blocks of 256 = 8 sub-blocks of 32, each with a 6-bit scale and min.
    import gguf

    b = raw.reshape(n * (k // 256), 144)
    d = _f16(b[:, 0:2])
    dmin = _f16(b[:, 2:4])
    sc, mn = gguf.quants.Q4_K.get_scale_min(b[:, 4:16])
    qs = b[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    codes = (qs & 0x0F).reshape(n, k)
    scale = (d * sc.astype(np.float32)).reshape(n, k // 32)
    zero = (-dmin * mn.astype(np.float32)).reshape(n, k // 32) + 8.0 * scale
    return _codes(codes, scale, zero)


def _codes(codes: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> Int4Codes:
    n = codes.shape[0]
    return Int4Codes(
        torch.from_numpy(np.ascontiguousarray(codes, dtype=np.uint8)),
        torch.from_numpy(np.ascontiguousarray(scale, dtype=np.float32).reshape(n, -1)),
        torch.from_numpy(np.ascontiguousarray(zero, dtype=np.float32).reshape(n, -1)),
        32,
    )
