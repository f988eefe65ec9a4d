"""A GGUF metadata reader shaped like gguf.GGUFReader (fields with parts/data/types, tensors with names) for
transformers' tokenizer and config conversion, parsed in one pass of struct reads.

gguf.GGUFReader builds a numpy memmap view for every part of every field: a 49k-token vocabulary and its
merges are ~250k views, 18-28 s of the demo's first start on a 2-core CPU (measured 2026-12-07, load ~3),
while the same bytes read with struct take well under a second. transformers reads only `fields` (through
`_gguf_parse_value(field.parts[i], field.types)` for i in field.data) and the tensors' names when it loads
a tokenizer or a config, so this reader gives exactly those, laid out as gguf-py lays them out:
parts = [key length, key bytes, value type, value parts...], data = the indices of the values.

Only the conversion child (gguf_cache._convert_here) uses it; weights are read by quant/gguf_file.py."""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass(slots=True)
class MetaField:
    name: str
    types: list[int] = field(default_factory=list)
    parts: list[Any] = field(default_factory=list)
    data: list[int] = field(default_factory=list)


@dataclass(slots=True)
class MetaTensor:
    name: str
    shape: tuple[int, ...]
    tensor_type: int
    data_offset: int


class GGUFMetaReader:
    """fields: name -> MetaField in file order; tensors: MetaTensor (name, shape, type, offset) — no data."""

    def __init__(self, path: str | Path, mode: str = "r") -> None:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            self._buf = m
            self._pos = 0
            try:
                self._parse()
            finally:
                self._buf = None  # no view may outlive the mapping

    def _take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self._buf, self._pos)
        self._pos += struct.calcsize(fmt)
        return value

    def _bytes(self) -> bytes:
        n = self._take("<Q")
        out = self._buf[self._pos:self._pos + n]
        self._pos += n
        return out

    def _value(self, vtype: int, f: MetaField) -> None:
        """Appends one value's parts to f, marking the part that holds the value in f.data."""
        if vtype == _STRING:
            raw = self._bytes()
            f.parts.append((len(raw),))
            f.data.append(len(f.parts))
            f.parts.append(raw)  # _gguf_parse_value decodes a sequence of byte values
        elif vtype in _SCALAR:
            f.data.append(len(f.parts))
            f.parts.append((self._take(_SCALAR[vtype]),))
        else:
            raise ValueError(f"unknown GGUF value type {vtype}")

    def _parse(self) -> None:
        if self._buf[:4] != b"GGUF":
            raise ValueError("not a GGUF file (no GGUF magic)")
        self._pos = 4
        version = self._take("<I")
        if version < 2:
            raise ValueError(f"GGUF version {version} is too old (2 or later is read)")
        n_tensors, n_kv = self._take("<Q"), self._take("<Q")
        self.fields: dict[str, MetaField] = {}
        # gguf-py lists the header's counts as fields too.
        for name, vtype, value in (("GGUF.version", 4, version), ("GGUF.tensor_count", 10, n_tensors),
                                   ("GGUF.kv_count", 10, n_kv)):
            self.fields[name] = MetaField(name, [vtype], [(value,)], [0])
        for _ in range(n_kv):
            key = self._bytes()
            vtype = self._take("<I")
            f = MetaField(key.decode("utf-8"), [vtype], [(len(key),), key, (vtype,)])
            if vtype == _ARRAY:
                etype, count = self._take("<I"), self._take("<Q")
                f.types.append(etype)
                f.parts += [(etype,), (count,)]
                if etype in _SCALAR:  # numbers: one struct call for the whole array
                    fmt = _SCALAR[etype]
                    size = struct.calcsize(fmt)
                    values = struct.unpack_from(f"<{count}{fmt[1]}", self._buf, self._pos)
                    self._pos += size * count
                    start = len(f.parts)
                    f.parts += [(v,) for v in values]
                    f.data += range(start, start + count)
                else:
                    for _ in range(count):
                        self._value(etype, f)
            else:
                self._value(vtype, f)
            self.fields[f.name] = f
        self.tensors: list[MetaTensor] = []
        for _ in range(n_tensors):
            name = self._bytes().decode("utf-8")
            dims = self._take("<I")
            shape = struct.unpack_from(f"<{dims}Q", self._buf, self._pos)
            self._pos += 8 * dims
            ttype, offset = self._take("<I"), self._take("<Q")
            self.tensors.append(MetaTensor(name, tuple(shape), ttype, offset))

    def get_field(self, key: str) -> MetaField | None:
        return self.fields.get(key)
