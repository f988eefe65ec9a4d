"""A .safetensors file's tensors as views of the file, memory-mapped: a weight the model keeps as stored (same
dtype, no transform) stays pages of the file, shared with the page cache (the OS can drop and re-read them),
instead of a private copy. safetensors' own get_tensor maps the file too (0.6 and later), but each tensor over
a storage of its own, so parts the model fuses were always copied.

The mapping is private copy-on-write (MAP_PRIVATE): a tensor written in place (a LoRA merge) gets private
pages for what it changes, and the file is never written. All of a file's tensors are views of one uint8
tensor over the whole mapping, so parts stored one after another (gate_proj then up_proj, as safetensors
orders names) can be fused without a copy (LinearMethod.fuse)."""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Iterator
from pathlib import Path

import torch

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64,
}  # fmt: skip


def read_header(path: str | Path) -> tuple[int, dict]:
    """(offset of the data, {name: {"dtype", "shape", "data_offsets"}}) without the "__metadata__" entry.
    A file cut short or not safetensors at all is safetensors' own SafetensorError, naming the file and the fix
    (a tensor past the end would otherwise be a SIGBUS when its pages are first read)."""
    from safetensors import SafetensorError

    try:
        with open(path, "rb") as f:
            file_size = f.seek(0, 2)
            f.seek(0)
            (size,) = struct.unpack("<Q", f.read(8))
            if 8 + size > file_size:
                raise ValueError(f"its header says {size} bytes, the file has {file_size}")
            header = json.loads(f.read(size))
        header.pop("__metadata__", None)
        end = max((int(e["data_offsets"][1]) for e in header.values()), default=0)
    except (OSError, ValueError, struct.error, KeyError, TypeError, IndexError) as exc:
        raise SafetensorError(f"{path} is not a readable safetensors file ({exc}): is the download complete? "
                              "Download the model again (wslm models pull).") from exc
    if 8 + size + end > file_size:
        raise SafetensorError(f"{path} is cut short: its tensors need {8 + size + end} bytes, the file has "
                              f"{file_size}. Download the model again (wslm models pull).")
    return 8 + size, header


def stored_bytes(path: str | Path) -> dict[str, int]:
    """Each tensor's bytes in the file, by name (load progress counts them)."""
    _, header = read_header(path)
    return {name: int(e["data_offsets"][1]) - int(e["data_offsets"][0]) for name, e in header.items()}


def iter_mapped(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) in file order, each a view of the mapped file."""
    start, header = read_header(path)
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size <= start:  # no tensor data: nothing to map
            mapped = None
        else:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    # One tensor over the whole file: it holds the mapping open for as long as any weight views it.
    whole = torch.frombuffer(mapped, dtype=torch.uint8) if mapped is not None else None
    for name, entry in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        dtype = _DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {name} has dtype {entry['dtype']}, which torch cannot hold.")
        shape = tuple(int(d) for d in entry["shape"])
        begin, end = (start + int(o) for o in entry["data_offsets"])
        if end == begin:
            yield name, torch.empty(shape, dtype=dtype)
            continue
        raw = whole[begin:end]
        if begin % dtype.itemsize:  # not aligned for its dtype (not written by safetensors): a copy
            raw = raw.clone()
        yield name, raw.view(dtype).view(shape)
