"""A GGUF file's tensor index and scalar metadata, read in one pass over the header, the tensors left in the
memory-mapped file until each is repacked.

gguf.GGUFReader parses every metadata entry into numpy arrays: a 49k-token vocabulary with its merges came to
158 MB of small arrays for the 98 MB demo file (1.6x the file), freed only after the weights started loading,
which made the load's peak 4.3x the file. The weights need none of it: here long arrays (the vocabulary, the
merges, the token types) are stepped over without being decoded, and only scalars, strings and short arrays
are kept. Tensors come out as GGUFReader's do (name, tensor_type, shape, data, data_offset, n_bytes), their
data numpy views of the mapping: nothing is read until a tensor is converted."""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_KEEP_ARRAY = 1024  # longer arrays are stepped over (None in values)
# ggml types whose data reads as plain numbers (the rest are blocks of bytes).
_PLAIN = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32, 27: np.int64, 28: np.float64}


@dataclass(slots=True)
class GGUFTensor:
    name: str
    tensor_type: object  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # as the file lists it: fastest dimension first
    n_elements: int
    n_bytes: int
    data_offset: int  # from the start of the file
    data: np.ndarray  # a view of the mapping: [rows..., bytes per row] for block types


class GGUFFile:
    """values: the metadata (long arrays as None); tensors: in file order; close() unmaps the file (the
    tensors' data views must be gone by then)."""

    def __init__(self, path: str | Path) -> None:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        with open(path, "rb") as f:
            self.buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if self.buf[:4] != b"GGUF":
            self.buf.close()
            raise ValueError(f"{path} is not a GGUF file")
        self.pos = 8  # magic, version
        n_tensors, n_kv = self._unpack("<Q"), self._unpack("<Q")
        self.values: dict[str, object] = {}
        for _ in range(n_kv):
            key = self._string()
            self.values[key] = self._value(self._unpack("<I"))
        index = []
        for _ in range(n_tensors):
            name = self._string()
            dims = tuple(self._unpack("<Q") for _ in range(self._unpack("<I")))
            index.append((name, dims, self._unpack("<I"), self._unpack("<Q")))
        align = int(self.values.get("general.alignment") or 32)
        self.data_start = -(-self.pos // align) * align
        self.array = np.frombuffer(self.buf, dtype=np.uint8)  # the whole file, mapped (no copy)
        self.tensors: list[GGUFTensor] = []
        for name, dims, kind, offset in index:
            qtype = GGMLQuantizationType(kind)
            block, type_size = GGML_QUANT_SIZES[qtype]
            n = int(np.prod(dims)) if dims else 1
            n_bytes = n * type_size // block
            start = self.data_start + offset
            raw = self.array[start : start + n_bytes]
            rows = tuple(reversed(dims))
            if kind in _PLAIN:
                data = raw.view(_PLAIN[kind]).reshape(rows)
            else:  # one row of blocks per weight row, as GGUFReader shapes it
                data = raw.reshape(*rows[:-1], rows[-1] // block * type_size)
            self.tensors.append(GGUFTensor(name, qtype, dims, n, n_bytes, start, data))

    def close(self) -> None:
        self.tensors.clear()
        self.array = None
        try:
            self.buf.close()
        except BufferError:  # a tensor view is still held somewhere: the mapping goes with it
            pass

    def drop_pages(self, t: GGUFTensor) -> None:
        """Give back a converted tensor's pages of the file: mapped pages count in the process's resident
        memory until the kernel needs them (as the page cache, they stay cached for the next start)."""
        if not hasattr(mmap, "MADV_DONTNEED"):
            return
        start = (t.data_offset // mmap.PAGESIZE) * mmap.PAGESIZE
        try:
            self.buf.madvise(mmap.MADV_DONTNEED, start, t.data_offset + t.n_bytes - start)
        except (OSError, ValueError):
            pass

    def _unpack(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        n = self._unpack("<Q")
        self.pos += n
        return self.buf[self.pos - n : self.pos].decode("utf-8", errors="replace")

    def _skip_strings(self, n: int) -> None:
        for _ in range(n):
            (length,) = struct.unpack_from("<Q", self.buf, self.pos)
            self.pos += 8 + length

    def _value(self, kind: int):
        if kind == _STRING:
            return self._string()
        if kind != _ARRAY:
            return self._unpack(_SCALARS[kind])
        item, n = self._unpack("<I"), self._unpack("<Q")
        if n > _KEEP_ARRAY and item in _SCALARS:
            self.pos += n * struct.calcsize(_SCALARS[item])
            return None
        if n > _KEEP_ARRAY and item == _STRING:
            self._skip_strings(n)
            return None
        values = [self._value(item) for _ in range(n)]  # short, or nested arrays (walked)
        return values if n <= _KEEP_ARRAY else None

    def f32_tensor(self, name: str) -> list[float] | None:
        """A small float32 tensor's values (rope factors), or None."""
        t = next((t for t in self.tensors if t.name == name), None)
        if t is None or t.data.dtype != np.float32:
            return None
        return t.data.astype(float).ravel().tolist()
