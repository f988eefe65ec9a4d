"""Read what the chat's model picker shows for a browsed .gguf (its quantization and context length) from
the file's header, in plain Python: the GUI never imports wslm.backend (docs/architecture.md), and the
file is on the GUI's own disk (a Windows path before it is handed to WSL)."""

from __future__ import annotations

import struct
from typing import BinaryIO

# general.file_type (llama.cpp's LLAMA_FTYPE): the common ones.
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
              11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
              18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 28: "IQ4_XS",
              30: "BF16"}
# GGUF value types: struct format of the fixed-size ones (8: string, 9: array).
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
MAX_KEYS = 10_000  # a corrupt count must not loop for ever


def _string(f: BinaryIO) -> str:
    (n,) = struct.unpack("<Q", f.read(8))
    return f.read(n).decode("utf-8", "replace")


def _value(f: BinaryIO, kind: int):
    if kind in SCALARS:
        fmt = SCALARS[kind]
        return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]
    if kind == 8:
        return _string(f)
    if kind == 9:
        item, count = struct.unpack("<IQ", f.read(12))
        if item in SCALARS:  # skipped whole (a tokenizer's scores: tens of thousands of numbers)
            f.seek(struct.calcsize(SCALARS[item]) * count, 1)
        else:
            for _ in range(count):
                _value(f, item)
        return None
    raise ValueError(f"unknown GGUF value type {kind}")


def read_header(path: str) -> dict:
    """{"quantization": "Q4_K_M", "context_length": 32768} as far as the header says; {} when the file is
    not a GGUF file. Reads the metadata only (no tensors)."""
    out: dict = {}
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            return {}
        _version, _tensors, keys = struct.unpack("<IQQ", f.read(20))
        for _ in range(min(keys, MAX_KEYS)):
            key = _string(f)
            (kind,) = struct.unpack("<I", f.read(4))
            value = _value(f, kind)
            if key == "general.file_type" and isinstance(value, int) and value in FILE_TYPES:
                out["quantization"] = FILE_TYPES[value]
            elif key.endswith(".context_length") and isinstance(value, int):
                out["context_length"] = value
            if len(out) == 2:
                break
    return out
