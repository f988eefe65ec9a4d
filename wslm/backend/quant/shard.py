"""Slices of quantized weights for tensor parallelism, taken without leaving the quantized form: each format
splits its scales (and zeros, groups) with the rows or input columns they belong to.

- rows (column-parallel q/k/v, gate/up; vocab-parallel tables): every format keeps the rows' codes and their
  per-row scales / per-row groups;
- input columns (row-parallel o, down): int8 keeps every row's scale (one per output channel, shared by all
  columns); int4 keeps the groups of its columns, so the shard must hold whole groups — vLLM refuses the
  same case. Act-order GPTQ (columns sorted by group) cannot keep its groups whole on a column shard: that
  shard goes to int8 per channel (8 bits of its exact 4-bit values, twice the bytes), with a warning."""

from __future__ import annotations

import logging

import torch

from wslm.backend.quant.int4 import Int4Codes
from wslm.backend.quant.int8 import Int8Weight, quantize_int8

logger = logging.getLogger("wslm.quant")


def narrow(weight, dim: int, start: int, length: int):
    """weight[start : start + length] along dim (0: output rows, 1: input columns), in weight's format."""
    if isinstance(weight, torch.Tensor):
        return weight.narrow(dim, start, length).contiguous()
    end = start + length
    if isinstance(weight, Int8Weight):
        if dim == 0:
            return Int8Weight(weight.qweight[start:end], weight.scales[start:end])
        return Int8Weight(weight.qweight[:, start:end], weight.scales)
    if isinstance(weight, Int4Codes):
        if dim == 0:
            return Int4Codes(weight.codes[start:end], weight.scales[start:end], weight.zeros[start:end],
                             weight.group_size, weight.perm)  # fmt: skip
        return _int4_columns(weight, start, end)
    raise TypeError(f"cannot split a {type(weight).__name__} weight across tensor-parallel ranks")


def _int4_columns(w: Int4Codes, start: int, end: int):
    g = w.group_size
    if start % g or end % g:
        raise ValueError(
            f"Tensor parallelism splits a 4-bit weight's {w.shape[1]} input columns into shards of "
            f"{end - start}, which its quantization groups of {g} columns do not divide. Use a "
            f"--tensor-parallel-size that leaves whole groups on each rank (the shard width must be a "
            f"multiple of {g}), or a checkpoint quantized with smaller groups."
        )
    if w.perm is not None:  # act-order: the shard's columns are scattered over every group
        logger.warning(
            "An act-order (desc_act) GPTQ weight split by input columns is kept in int8 on each rank "
            "(its groups cannot stay whole): exact values, twice the bytes of int4 for this layer."
        )
        return quantize_int8(w.dequantize(torch.float32)[:, start:end])
    return Int4Codes(w.codes[:, start:end], w.scales[:, start // g : end // g], w.zeros[:, start // g : end // g], g)


def pad_rows(weight, rows: int):
    """weight with zero rows appended up to `rows` (the last rank's slice of a padded vocabulary; tables are
    dense or int8)."""
    missing = rows - weight.shape[0]
    if missing <= 0:
        return weight
    if isinstance(weight, torch.Tensor):
        return torch.cat([weight, weight.new_zeros(missing, *weight.shape[1:])])
    if isinstance(weight, Int8Weight):
        return Int8Weight(torch.cat([weight.qweight, weight.qweight.new_zeros(missing, weight.shape[1])]),
                          torch.cat([weight.scales, weight.scales.new_zeros(missing)]))  # fmt: skip
    raise TypeError(f"cannot pad a {type(weight).__name__} weight")


def checkpoint_group_size(source, quantization: str | None) -> int | None:
    """The 4-bit group width a checkpoint's weights keep under tensor parallelism (checked before any
    worker starts), by wslm.tp_sizes.checkpoint_group: the rule `wslm models list` reports for the GUI."""
    from wslm.tp_sizes import checkpoint_group

    if quantization in ("awq", "gptq"):
        from wslm.backend.quant.packed_checkpoint import read_quant_config

        return checkpoint_group(quantization, read_quant_config(source.folder))
    return checkpoint_group(quantization)
