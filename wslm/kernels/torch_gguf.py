"""PyTorch reference of the GGUF block formats: the bytes as the file stores them, dequantized.

A GGUF weight of `cols` inputs is, per output row, cols / QK blocks of BB bytes each (the file's own
layout, read as a uint8 tensor [rows, bytes_per_row]). This module decodes them exactly as gguf-py's
`gguf.quants.dequantize` does (tests/test_kernels_gguf.py checks bit equality), and gives the matmul
references the Triton kernels (triton_gguf.py) are tested against. Every dequantized value is computed in
float32 and is exact there except the one subtraction/addition of a K-quant's (or Q4_1's) minimum: the
products d * scale * q fit float32's 24-bit significand, so the order of the products does not matter.

Block layouts (little endian; f16 = IEEE half):
  Q4_0  18 B / 32: f16 d, 16 B nibbles (weight j < 16: low nibble of byte j; j >= 16: high nibble of j - 16);
        w = d * (q - 8)
  Q4_1  20 B / 32: f16 d, f16 m, 16 B nibbles as Q4_0; w = d * q + m
  Q5_0  22 B / 32: f16 d, 4 B of fifth bits (a little-endian uint32, bit j for weight j), 16 B nibbles as
        Q4_0; w = d * ((nibble | bit << 4) - 16)
  Q5_1  24 B / 32: f16 d, f16 m, 4 B fifth bits, 16 B nibbles; w = d * q + m
  Q8_0  34 B / 32: f16 d, 32 int8; w = d * q
  Q4_K 144 B / 256: f16 d, f16 dmin, 12 B of 6-bit scales and mins for 8 sub-blocks of 32, 128 B nibbles
        (sub-block 2c: low nibbles of bytes 32c..32c+31; 2c + 1: their high nibbles);
        w = d * sc[s] * q - dmin * mn[s]
  Q5_K 176 B / 256: as Q4_K plus 32 B of high bits after the scales (weight l of sub-block s: bit s of
        byte l) before the nibbles; q = nibble | high << 4
  Q6_K 210 B / 256: 128 B low nibbles, 64 B high 2-bit pairs, 16 int8 scales (one per 16 weights), f16 d;
        weight 128h + r: nibble of byte 64h + r % 64 (high nibble when r >= 64), 2 bits of byte
        128 + 32h + r % 32 at shift 2 * (r // 32); w = d * scale * (q - 32)"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BlockFormat:
    name: str
    type_id: int  # ggml_type (gguf.GGMLQuantizationType)
    block_weights: int  # QK
    block_bytes: int
    scale_group: int  # consecutive weights that share one scale (and min)


FORMATS = {
    f.name: f
    for f in (
        BlockFormat("Q4_0", 2, 32, 18, 32),
        BlockFormat("Q4_1", 3, 32, 20, 32),
        BlockFormat("Q5_0", 6, 32, 22, 32),
        BlockFormat("Q5_1", 7, 32, 24, 32),
        BlockFormat("Q8_0", 8, 32, 34, 32),
        BlockFormat("Q4_K", 12, 256, 144, 32),
        BlockFormat("Q5_K", 13, 256, 176, 32),
        BlockFormat("Q6_K", 14, 256, 210, 16),
    )
}
_BY_ID = {f.type_id: f for f in FORMATS.values()}


def block_format(ggml_type: int | str) -> BlockFormat:
    """The format of a ggml type given by name ("Q4_K"), number (12) or gguf.GGMLQuantizationType."""
    if isinstance(ggml_type, str):
        fmt = FORMATS.get(ggml_type.upper())
    else:
        fmt = _BY_ID.get(int(ggml_type))
    if fmt is None:
        raise ValueError(
            f"GGUF type {getattr(ggml_type, 'name', ggml_type)!r} has no block kernel: supported are "
            f"{', '.join(FORMATS)}"
        )
    return fmt


def weight_shape(raw: torch.Tensor, ggml_type: int | str) -> tuple[int, int]:
    """(rows, cols) of the weight whose blocks `raw` [rows, bytes_per_row] holds."""
    fmt = block_format(ggml_type)
    if raw.dtype != torch.uint8 or raw.dim() != 2:
        raise ValueError(f"GGUF block bytes must be a 2-D uint8 tensor [rows, bytes_per_row], got "
                         f"{raw.dtype} {tuple(raw.shape)}")
    if raw.shape[1] % fmt.block_bytes:
        raise ValueError(f"{fmt.name}: {raw.shape[1]} bytes per row is not a whole number of "
                         f"{fmt.block_bytes}-byte blocks")
    return raw.shape[0], raw.shape[1] // fmt.block_bytes * fmt.block_weights


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[..., 2] uint8 -> [...] float32 (little-endian halves)."""
    return b.contiguous().view(torch.float16).squeeze(-1).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[..., n] bytes -> [..., 2n]: the n low nibbles, then the n high ones."""
    return torch.cat((qs & 0xF, qs >> 4), dim=-1)


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K: 12 bytes [..., 12] -> 6-bit scales and mins [..., 8] (int32)."""
    s = s.to(torch.int32)
    lo, mid, hi = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat((lo & 63, (hi & 15) | ((lo >> 6) << 4)), dim=-1)
    mn = torch.cat((mid & 63, (hi >> 4) | ((mid >> 6) << 4)), dim=-1)
    return sc, mn


def dequantize(raw: torch.Tensor, ggml_type: int | str) -> torch.Tensor:
    """GGUF block bytes [rows, bytes_per_row] -> float32 [rows, cols], equal to gguf-py's dequantize."""
    fmt = block_format(ggml_type)
    rows, cols = weight_shape(raw, ggml_type)
    b = raw.reshape(rows, -1, fmt.block_bytes)
    name = fmt.name
    if fmt.block_weights == 32:
        d = _f16(b[..., 0:2])[..., None]
        if name == "Q8_0":
            w = d * b[..., 2:].view(torch.int8).float()
        elif name == "Q4_0":
            w = d * (_nibbles(b[..., 2:]).float() - 8)
        elif name == "Q4_1":
            w = d * _nibbles(b[..., 4:]).float() + _f16(b[..., 2:4])[..., None]
        else:  # Q5_0 / Q5_1: the fifth bit of weight j is bit j % 8 of byte j // 8 of qh
            at = 2 if name == "Q5_0" else 4
            bits = torch.arange(8, device=raw.device)
            qh = ((b[..., at:at + 4, None].to(torch.int32) >> bits) & 1).reshape(rows, -1, 32)
            q = (_nibbles(b[..., at + 4:]).to(torch.int32) | (qh << 4)).float()
            w = d * (q - 16) if name == "Q5_0" else d * q + _f16(b[..., 2:4])[..., None]
    elif name in ("Q4_K", "Q5_K"):
        nb = b.shape[1]
        d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
        sc, mn = _k_scales(b[..., 4:16])
        qs_at = 16 if name == "Q4_K" else 48
        # 4 chunks of 32 bytes; each gives sub-block 2c (low nibbles) and 2c + 1 (high nibbles)
        q = _nibbles(b[..., qs_at:qs_at + 128].reshape(rows, nb, 4, 32)).reshape(rows, nb, 8, 32).to(torch.int32)
        if name == "Q5_K":
            qh = b[..., 16:48].to(torch.int32)[:, :, None, :]
            q = q | (((qh >> torch.arange(8, device=raw.device)[:, None]) & 1) << 4)
        scale = (d[..., None] * sc.float())[..., None]
        mins = (dmin[..., None] * mn.float())[..., None]
        w = scale * q.float() - mins
    else:  # Q6_K
        nb = b.shape[1]
        ql = b[..., 0:128].reshape(rows, nb, 2, 64)
        qh = b[..., 128:192].reshape(rows, nb, 2, 32).to(torch.int32)
        low = _nibbles(ql).to(torch.int32)  # [rows, nb, 2, 128]: r -> nibble of byte r % 64
        shifts = torch.arange(0, 8, 2, device=raw.device)[:, None]
        high = ((qh[:, :, :, None, :] >> shifts) & 3).reshape(rows, nb, 2, 128)  # r -> byte r % 32 >> 2 (r // 32)
        q = (low | (high << 4)) - 32
        scales = b[..., 192:208].view(torch.int8).float()
        d = _f16(b[..., 208:210])
        w = (d[..., None] * scales)[..., None] * q.reshape(rows, nb, 16, 16).float()
    return w.reshape(rows, cols)


def check_out(out: torch.Tensor | None, m: int, n: int, dtype: torch.dtype) -> None:
    """`out` of gguf_matmul: [m, n] (m = the activations' rows flattened) in their dtype, last axis contiguous
    (a column slice of a fused projection's output qualifies)."""
    if out is None:
        return
    if tuple(out.shape) != (m, n) or out.dtype != dtype or (n > 1 and out.stride(-1) != 1):
        raise ValueError(f"gguf_matmul: out must be a [{m}, {n}] {dtype} tensor with a contiguous last axis, "
                         f"got {tuple(out.shape)} {out.dtype} strides {out.stride()}")


def matmul(x: torch.Tensor, raw: torch.Tensor, ggml_type: int | str, *, round_weight: bool = False,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., cols] @ dequantize(raw).T -> [..., rows] in x's dtype, summed in float32 (written into `out`
    [rows of x, rows] when given; see check_out).

    round_weight=False: float32 weights times float32 activations (what the decode kernel computes).
    round_weight=True: the weights rounded to x's dtype first (what the prefill GEMM's tensor-core dot
    computes for 16-bit activations)."""
    rows, cols = weight_shape(raw, ggml_type)
    if x.shape[-1] != cols:
        raise ValueError(f"gguf_matmul: activations have {x.shape[-1]} features, the "
                         f"{block_format(ggml_type).name} weight {cols}")
    m = x.numel() // cols if cols else 0
    check_out(out, m, rows, x.dtype)
    w = dequantize(raw, ggml_type)
    if round_weight:
        w = w.to(x.dtype).float()
    y = (x.float() @ w.t()).to(x.dtype)
    return y if out is None else out.copy_(y.reshape(m, rows))
