"""AWQ / GPTQ safetensors checkpoints: the per-linear pieces (qweight, qzeros, scales, g_idx) are gathered
as the files are read and come out as one int4 weight under the linear's `.weight` name."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from wslm.backend.quant import awq, gptq


def read_quant_config(folder: Path) -> dict:
    cfg = json.loads((folder / "config.json").read_text())
    return dict(cfg.get("quantization_config") or {})


def repack(weights: Iterable[tuple[str, object]], method: str, qcfg: dict) -> Iterator[tuple[str, object]]:
    bits = int(qcfg.get("bits", qcfg.get("w_bit", 4)))
    if bits != 4:
        raise ValueError(f"{method} checkpoints with {bits}-bit weights are not supported (4-bit only).")
    group = int(qcfg.get("group_size", qcfg.get("q_group_size", 128)))
    if group <= 0:
        raise ValueError(f"{method} checkpoints without groups (group_size {group}) are not supported yet.")
    if method == "awq" and str(qcfg.get("version", "gemm")).lower() != "gemm":
        raise ValueError(f"AWQ version {qcfg.get('version')!r} is not supported (GEMM only).")
    # The original GPTQ format stores each zero point minus one; gptq_v2 stores it as is.
    offset = 0 if str(qcfg.get("checkpoint_format", "gptq")).lower() == "gptq_v2" else 1
    pending: dict[str, dict] = {}
    for name, tensor in weights:
        prefix, _, part = name.rpartition(".")
        if part not in ("qweight", "qzeros", "scales", "g_idx"):
            yield name, tensor
            continue
        parts = pending.setdefault(prefix, {})
        parts[part] = tensor
        if all(p in parts for p in awq.PARTS) and (method == "awq" or "g_idx" in parts):
            del pending[prefix]
            codes = awq.to_codes(parts, group) if method == "awq" else gptq.to_codes(parts, group, offset)
            yield prefix + ".weight", codes
    for prefix, parts in pending.items():  # GPTQ checkpoints saved without g_idx
        if method == "gptq" and all(p in parts for p in gptq.PARTS):
            yield prefix + ".weight", gptq.to_codes(parts, group, offset)
        else:
            raise ValueError(f"The {method} checkpoint is missing parts of {prefix}: has {sorted(parts)}.")
