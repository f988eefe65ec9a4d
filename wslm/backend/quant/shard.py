"""Slices of quantized weights for tensor parallelism, taken without leaving the quantized form: each format
splits its scales (and zeros, groups) with the rows or input columns they belong to.

- rows (column-parallel q/k/v, gate/up; vocab-parallel tables): every format keeps the rows' codes and their
  per-row scales / per-row groups;
- input columns (row-parallel o, down): int8 keeps every row's scale (one per output channel, shared by all
  columns); int4 keeps the groups of its columns, so the shard must hold whole groups — vLLM refuses the
  same case. Act-order GPTQ (columns sorted by group) cannot keep its groups whole on a column shard: that
  shard goes to int8 per channel (8 bits of its exact 4-bit values, twice the bytes), with a warning."""

from __future__ import annotations

import torch


def narrow(weight, dim: int, start: int, length: int):
    """weight[start : start + length] along dim (0: output rows, 1: input columns), in weight's format (each
    quantized form slices itself: its shard method)."""
    if isinstance(weight, torch.Tensor):
        return weight.narrow(dim, start, length).contiguous()
    shard = getattr(weight, "shard", None)
    if shard is None:
        raise TypeError(f"cannot split a {type(weight).__name__} weight across tensor-parallel ranks")
    return shard(dim, start, length)


def pad_rows(weight, rows: int):
    """weight with zero rows appended up to `rows` (the last rank's slice of a padded vocabulary; tables are
    dense or int8)."""
    missing = rows - weight.shape[0]
    if missing <= 0:
        return weight
    if isinstance(weight, torch.Tensor):
        return torch.cat([weight, weight.new_zeros(missing, *weight.shape[1:])])
    append = getattr(weight, "append_zero_rows", None)
    if append is None:
        raise TypeError(f"cannot pad a {type(weight).__name__} weight")
    return append(missing)


def checkpoint_group_size(source, quantization: str | None) -> int | None:
    """The group width a checkpoint's weights keep under tensor parallelism (checked before any worker
    starts): the format's QuantMethod.group_size, the rule `wslm models list` reports for the GUI."""
    from wslm.backend.quant.registry import checkpoint_group, read_quant_config

    return checkpoint_group(quantization, None if source.gguf_file else read_quant_config(source.folder))
