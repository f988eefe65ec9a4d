"""AutoAWQ GEMM checkpoints (quant_method "awq", version "gemm"): per linear, qweight int32 [K, N/8] and
qzeros int32 [K/g, N/8] packed along the output dimension in AWQ's interleaved nibble order, scales fp16
[K/g, N]; w[k, n] = (q[k, n] - z[g, n]) * s[g, n]. Repacked to int4 codes (tinygemm's convention)."""

from __future__ import annotations

import torch

from wslm.backend.quant.int4 import Int4Codes

# Nibble i of a packed int32 holds output column 8 * j + _ORDER[i] (AutoAWQ's AWQ_ORDER).
_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
PARTS = ("qweight", "qzeros", "scales")


def unpack_cols(packed: torch.Tensor, order=_ORDER) -> torch.Tensor:
    """[R, C/8] int32 -> [R, C] uint8, nibble i of word j going to column 8 * j + order[i]."""
    rows, words = packed.shape
    out = torch.empty(rows, words, 8, dtype=torch.uint8)
    for i, col in enumerate(order):
        out[:, :, col] = ((packed >> (4 * i)) & 0xF).to(torch.uint8)
    return out.reshape(rows, words * 8)


def to_codes(parts: dict[str, torch.Tensor], group_size: int) -> Int4Codes:
    q = unpack_cols(parts["qweight"])  # [K, N]
    z = unpack_cols(parts["qzeros"]).float()  # [K/g, N]
    s = parts["scales"].float()  # [K/g, N]
    return Int4Codes(q.t().contiguous(), s.t().contiguous(), ((8.0 - z) * s).t().contiguous(), group_size)
