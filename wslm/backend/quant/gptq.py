"""GPTQ checkpoints (AutoGPTQ / GPTQModel, 4-bit): per linear, qweight int32 [K/8, N] packed along the
input dimension, qzeros int32 [G, N/8] packed along the output dimension (in the original "gptq" format
stored as zero - 1), scales fp16 [G, N], g_idx int32 [K] (the group of each input column; not sorted when
the checkpoint was made with act-order / desc_act). w[k, n] = (q[k, n] - z[g_idx[k], n]) * s[g_idx[k], n].

Act-order groups are made contiguous by sorting the input columns by group once, here; the int4 weight
then permutes the activations the same way per call (Int4Weight.perm)."""

from __future__ import annotations

import torch

from wslm.backend.quant.awq import unpack_cols
from wslm.backend.quant.int4 import Int4Codes

PARTS = ("qweight", "qzeros", "scales")  # g_idx too when present
_SEQUENTIAL = tuple(range(8))


def to_codes(parts: dict[str, torch.Tensor], group_size: int, zero_offset: int = 1) -> Int4Codes:
    qweight = parts["qweight"]
    k = qweight.shape[0] * 8
    q = unpack_cols(qweight.t().contiguous(), _SEQUENTIAL)  # [N, K]
    z = unpack_cols(parts["qzeros"], _SEQUENTIAL).float() + zero_offset  # [G, N]
    s = parts["scales"].float()  # [G, N]
    g_idx = parts.get("g_idx")
    if g_idx is None:
        g_idx = torch.arange(k) // group_size
    g_idx = g_idx.long()
    perm = None
    if not bool((g_idx[1:] >= g_idx[:-1]).all()):  # act-order: sort the columns by their group
        perm = torch.argsort(g_idx, stable=True)
        q = q[:, perm]
        g_idx = g_idx[perm]
    groups = g_idx.reshape(-1, group_size)
    if not bool((groups == groups[:, :1]).all()):
        raise ValueError("This GPTQ checkpoint's groups are not of equal size; wslm cannot repack it.")
    first = groups[:, 0]
    scale = s[first].t().contiguous()  # [N, K/g]
    zero = ((8.0 - z[first]) * s[first]).t().contiguous()
    return Int4Codes(q.contiguous(), scale, zero, group_size, perm)
