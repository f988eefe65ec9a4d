"""AWQ / GPTQ safetensors checkpoints: the per-linear pieces (qweight, qzeros, scales, g_idx) are gathered
as the files are read and come out as one int4 weight under the linear's `.weight` name; the format's method
(methods/awq.py, methods/gptq.py) says when a linear's pieces are complete and how they unpack."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

_PIECES = ("qweight", "qzeros", "scales", "g_idx")


def repack(weights: Iterable[tuple[str, object]], method, qcfg: dict) -> Iterator[tuple[str, object]]:
    """`method`: a methods.packed.PackedInt4Method (to_codes, parts_complete, parts_enough)."""
    method.check_checkpoint(qcfg)
    pending: dict[str, dict] = {}
    for name, tensor in weights:
        prefix, _, part = name.rpartition(".")
        if part not in _PIECES:
            yield name, tensor
            continue
        parts = pending.setdefault(prefix, {})
        parts[part] = tensor
        if method.parts_complete(parts):
            del pending[prefix]
            yield prefix + ".weight", method.to_codes(parts, qcfg)
    for prefix, parts in pending.items():  # GPTQ checkpoints saved without g_idx
        if not method.parts_enough(parts):
            raise ValueError(f"The {method.name} checkpoint is missing parts of {prefix}: has {sorted(parts)}.")
        yield prefix + ".weight", method.to_codes(parts, qcfg)
