"""Many-row int4 products on CPU: dequantize the weight from torch's CPU int4 pack, then one bf16 GEMM.

aten._weight_int4pack_mm_for_cpu runs one matrix-vector product per activation row: its time grows
linearly with the rows (3072x576, one thread: 0.13 ms at 1 row, 2.9 ms at 64, 11.4 ms at 256, 47 ms at
1024) while a bf16 GEMM barely grows (0.37 / 0.55 / 1.1 / 3.3 ms). Expanding the weight to bf16 for the
call costs ~4 ms for that shape, so from ~128 rows (prefill chunks) expand-then-GEMM wins: 6.1 ms at 256
rows. The expanded weight is dropped right after the call: resident memory stays int4.

The pack's layout is torch's, not a documented format, and it depends on the SIMD width torch runs with:
for each block of 64 output rows (AVX-512; 32 with AVX2 only) and each input column, 32 (16) bytes whose
low nibbles are the block's first half of rows and high nibbles its second. It is checked once per weight
against the codes it was packed from (`pack_block`); a weight whose pack matches neither (another torch, a
row count not a multiple of the block) keeps the kernel for every row count."""

from __future__ import annotations

import torch

from wslm import envs

BLOCKS = (64, 32)  # rows per pack block: AVX-512 torch, AVX2 torch
# Rows from which expand-then-GEMM wins: the crossover is the expansion's cost over the kernel's per-row
# cost, both memory-bound passes, so it moves little between CPUs (measured ~100 rows on an AMX Xeon).
# WSLM_INT4_DENSE_ROWS overrides (0: always the kernel).
DENSE_ROWS = envs.WSLM_INT4_DENSE_ROWS or 1 << 62  # a constant: read on the hot path


def unpack_codes(packed: torch.Tensor, n: int, k: int, block_n: int = 64) -> torch.Tensor:
    """[n, k] uint8 codes 0..15 from the CPU pack of an [n, k] weight (n a multiple of block_n)."""
    b = packed.view(torch.uint8).reshape(n // block_n, k, block_n // 2)
    codes = torch.stack((b & 0x0F, b >> 4), dim=2)  # [blocks, k, 2, half]: first half of rows, then second
    return codes.reshape(n // block_n, k, block_n).transpose(1, 2).reshape(n, k)


# Rows packed (and checked) at a time: a multiple of every block, so that the pieces are the whole's pack.
_PACK_ROWS = 256


def pack_cpu(codes: torch.Tensor) -> torch.Tensor:
    """torch's CPU int4 pack of [n, k] codes, _PACK_ROWS rows at a time: the op takes the codes as int32, 8x
    the packed bytes, which for a whole fused gate|up was most of a GGUF load's peak over its weights. Each
    block of rows is packed on its own (pack_block checks the result against the codes)."""
    n, k = codes.shape
    packed = None
    for r in range(0, n, _PACK_ROWS):
        part = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes[r : r + _PACK_ROWS].to(torch.int32), 1)
        if packed is None:
            if part.shape[0] == n:  # one piece: the whole pack
                return part
            packed = part.new_empty((n, *part.shape[1:]))
        packed[r : r + part.shape[0]] = part
    return packed


def pack_block(packed: torch.Tensor, codes: torch.Tensor) -> int:
    """The pack's rows per block (64 or 32) where it reads back to codes exactly, else 0 (compared
    _PACK_ROWS rows at a time: the unpacked copies stay small)."""
    n, k = codes.shape
    if packed.numel() * packed.element_size() != n * k // 2:
        return 0
    rows = packed.view(torch.uint8).reshape(n, k // 2)
    for block_n in BLOCKS:
        if n % block_n == 0 and all(
            torch.equal(unpack_codes(rows[r : r + _PACK_ROWS], min(_PACK_ROWS, n - r), k, block_n),
                        codes[r : r + _PACK_ROWS].to(torch.uint8))
            for r in range(0, n, _PACK_ROWS)
        ):  # fmt: skip
            return block_n
    return 0


def dequantize_packed(packed: torch.Tensor, scales_and_zeros: torch.Tensor, n: int, k: int, group: int,
                      dtype: torch.dtype = torch.bfloat16, block_n: int = 64) -> torch.Tensor:
    """The [n, k] weight (q - 8) * scale + zero, computed in bf16 as the kernel does. Expanded in the
    pack's own [blocks, k, block_n] order (contiguous reads and writes), then transposed once."""
    blocks, groups = n // block_n, k // group
    b = packed.view(torch.uint8).view(blocks, groups, group, block_n // 2)
    codes = torch.cat((b & 0x0F, b >> 4), dim=-1)  # [blocks, groups, group, block_n]
    sz = scales_and_zeros.float()  # [groups, n, 2]

    def per_lane(t: torch.Tensor) -> torch.Tensor:  # [groups, n] -> [blocks, groups, 1, block_n]
        return t.t().reshape(blocks, block_n, groups).permute(0, 2, 1).unsqueeze(2).to(dtype).contiguous()

    scale, offset = per_lane(sz[..., 0]), per_lane(sz[..., 1] - 8.0 * sz[..., 0])
    w = torch.addcmul(offset, codes.to(dtype), scale)  # [blocks, groups, group, block_n]
    return w.view(blocks, k, block_n).transpose(1, 2).reshape(n, k)
