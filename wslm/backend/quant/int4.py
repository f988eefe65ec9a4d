"""int4 weight-only, asymmetric, one (scale, zero) per group of `group_size` input columns:
w[n, k] = (q[n, k] - 8) * scale[n, g] + zero[n, g], q in 0..15, g = k // group_size — torch's tinygemm
convention, which every 4-bit source maps onto exactly (Q4_0: zero 0; Q4_1/Q4_K/AWQ/GPTQ: zero = m + 8 d).

Runtime kernels: CPU aten._weight_int4pack_mm_for_cpu (bf16 activations: its fp32 path is a scalar
fallback, 30x slower; float32 on request, see int8.compute_dtype), CUDA aten._weight_int4pack_mm (tinygemm,
bf16). Act-order GPTQ checkpoints keep their groups contiguous by permuting the input columns once at load
and the activations per call."""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from wslm.backend.quant.int4_dense import DENSE_ROWS, dequantize_packed, pack_block, pack_cpu
from wslm.backend.quant.int8 import Int8Weight, compute_dtype, quantize_int8
from wslm.backend.quant.kernel import WeightKernel
from wslm.kernels import cpu_gemv

logger = logging.getLogger("wslm.quant")
GROUP_SIZES = (32, 64, 128, 256)


class Int4Codes:
    """Unpacked codes while loading: rows can still be permuted (GGUF q/k) and concatenated (qkv fusion)."""

    __slots__ = ("codes", "scales", "zeros", "group_size", "perm")
    bits = 4
    kind = "int4_codes"  # a loading form, packed by to_runtime

    def __init__(self, codes, scales, zeros, group_size: int, perm: torch.Tensor | None = None) -> None:
        self.codes = codes  # [N, K] uint8, 0..15
        self.scales = scales  # [N, K // group_size] fp32
        self.zeros = zeros  # [N, K // group_size] fp32
        self.group_size = group_size
        self.perm = perm  # [K] int64 input-column order (act-order GPTQ), or None

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        s = self.scales.repeat_interleave(self.group_size, dim=1)
        z = self.zeros.repeat_interleave(self.group_size, dim=1)
        w = (self.codes.float() - 8.0) * s + z
        if self.perm is not None:  # back to the checkpoint's column order
            w = torch.empty_like(w).index_copy_(1, self.perm, w)
        return w.to(dtype)

    def pack(self, device: torch.device, dtype: torch.dtype = torch.bfloat16) -> Int4Weight:
        return Int4Weight.from_codes(self, device, dtype)

    def to_runtime(self, device: torch.device, dtype: torch.dtype) -> Int4Weight | Int8Weight:
        """The runtime form on the engine's device (linear.finalize)."""
        if self.shape[0] % 16:  # torch's int4 packing tiles 16 output rows; odd shapes go to int8
            if compute_dtype(device, dtype) == torch.float32:  # exact float32 asked: int8 would re-quantize
                return self.dequantize(torch.float32).to(device)
            return quantize_int8(self.dequantize(torch.float32)).to_runtime(device, dtype)
        return self.pack(device, dtype)

    def take_rows(self, rows: torch.Tensor) -> Int4Codes:
        """The codes with their rows reordered (GGUF's q/k permutation)."""
        return Int4Codes(self.codes[rows], self.scales[rows], self.zeros[rows], self.group_size, self.perm)

    def shard(self, dim: int, start: int, length: int) -> Int4Codes | Int8Weight:
        """Output rows (dim 0) with their groups, or input columns (dim 1) holding whole groups (shard.py)."""
        end = start + length
        if dim == 0:
            return Int4Codes(self.codes[start:end], self.scales[start:end], self.zeros[start:end],
                             self.group_size, self.perm)  # fmt: skip
        g = self.group_size
        if start % g or end % g:
            raise ValueError(
                f"Tensor parallelism splits a 4-bit weight's {self.shape[1]} input columns into shards of "
                f"{end - start}, which its quantization groups of {g} columns do not divide. Use a "
                f"--tensor-parallel-size that leaves whole groups on each rank (the shard width must be a "
                f"multiple of {g}), or a checkpoint quantized with smaller groups."
            )
        if self.perm is not None:  # act-order: the shard's columns are scattered over every group
            logger.warning(
                "An act-order (desc_act) GPTQ weight split by input columns is kept in int8 on each rank "
                "(its groups cannot stay whole): exact values, twice the bytes of int4 for this layer."
            )
            return quantize_int8(self.dequantize(torch.float32)[:, start:end])
        return Int4Codes(self.codes[:, start:end], self.scales[:, start // g : end // g],
                         self.zeros[:, start // g : end // g], g)  # fmt: skip


def cat_codes(parts: list[Int4Codes]) -> Int4Codes:
    first = parts[0]
    return Int4Codes(
        torch.cat([p.codes for p in parts]),
        torch.cat([p.scales for p in parts]),
        torch.cat([p.zeros for p in parts]),
        first.group_size,
        first.perm,
    )


class Int4Weight:
    __slots__ = ("packed", "scales_and_zeros", "group_size", "out_features", "in_features", "perm", "block_n",
                 "_ours")  # fmt: skip
    bits = 4
    kind = "int4"  # registry.WEIGHT_CLASSES

    def __init__(
        self, packed, scales_and_zeros, group_size: int, out_features: int, in_features: int, perm
    ) -> None:
        self.packed = packed
        self.scales_and_zeros = scales_and_zeros  # [K // group_size, N, 2], the kernel's dtype
        self.group_size = group_size
        self.out_features = out_features
        self.in_features = in_features
        self.perm = perm
        self.block_n = 0  # CPU: the pack's rows per block where it reads back exactly (int4_dense.py)
        self._ours: bool | None = None  # _c_ok(), once decided

    @classmethod
    def from_codes(cls, c: Int4Codes, device: torch.device, dtype: torch.dtype = torch.bfloat16) -> Int4Weight:
        n, k = c.codes.shape
        sz = (
            torch.stack([c.scales.t(), c.zeros.t()], dim=-1)
            .contiguous()
            .to(device=device, dtype=compute_dtype(device, dtype))
        )
        if device.type == "cuda":
            packed_bytes = (c.codes[:, ::2] << 4 | c.codes[:, 1::2]).to(torch.uint8).to(device)
            packed = torch.ops.aten._convert_weight_to_int4pack(packed_bytes, 8)
        else:
            packed = pack_cpu(c.codes)
        perm = None if c.perm is None else c.perm.to(device)
        weight = cls(packed, sz, c.group_size, n, k, perm)
        if device.type == "cpu":
            weight.block_n = pack_block(packed, c.codes)
        return weight

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.out_features, self.in_features))

    @property
    def unpackable(self) -> bool:
        """Whether the pack's layout is known here: then many rows take one GEMM over the expanded weight,
        and one row cpu_gemv's kernel."""
        return self.block_n > 0

    @property
    def nbytes(self) -> int:
        return (
            self.packed.numel() * self.packed.element_size()
            + self.scales_and_zeros.numel() * self.scales_and_zeros.element_size()
        )

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if (
            x.dim() == 2 and x.shape[0] < DENSE_ROWS and x.device.type == "cpu" and self.perm is None
            and x.is_contiguous()
        ):  # fmt: skip
            # Decode on CPU: the kernel alone. Each extra op (reshape, a no-op .to) costs microseconds
            # here, where the weights just streamed through have evicted the dispatcher's caches.
            kd = self.scales_and_zeros.dtype
            if x.dtype == kd:
                out = self._rows(x)
                return out if bias is None else out + bias
            if x.dtype == torch.float32:  # a float32 engine (CPUs without bf16): the kernel's dtype and back
                out = self._rows(x.to(kd)).to(x.dtype)
                return out if bias is None else out + bias
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self.perm is not None:
            x2 = x2.index_select(1, self.perm)
        if x.device.type == "cpu" and self.unpackable and (x2.shape[0] >= DENSE_ROWS or self._float32()):
            # Prefill, big batches: one GEMM in the activations' dtype (float32 where dtype=auto chose it:
            # those CPUs have no native bf16 GEMM).
            return F.linear(x2, self._dense_packed_order(x.dtype), bias).reshape(*shape[:-1], self.out_features)
        x2 = x2.to(self.scales_and_zeros.dtype)
        if x.device.type == "cuda":
            out = torch.ops.aten._weight_int4pack_mm(
                x2.contiguous(), self.packed, self.group_size, self.scales_and_zeros
            )
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x2.contiguous(), self.packed, self.group_size, self.scales_and_zeros
            )
        out = out.to(x.dtype).reshape(*shape[:-1], self.out_features)
        return out if bias is None else out + bias

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """x @ w.T for decode rows on CPU (2-D, contiguous, in the kernel's dtype, fewer than DENSE_ROWS,
        no act-order permutation): cpu_gemv's kernels where they are built and read this pack, else
        torch's. apply and the back ends (through kernel().mm) both call this, so they pick the same kernel."""
        ours = self._c_ok()
        if ours and x.shape[0] == 1:  # reads ahead
            return cpu_gemv.int4_mv(x, self.packed, self.scales_and_zeros, self.group_size, block_n=self.block_n)
        if ours:  # a few rows: each weight block read once for all of them (1.5-1.8x torch's kernel)
            return cpu_gemv.int4_mm(x, self.packed, self.scales_and_zeros, self.group_size, self.block_n)
        if self.unpackable and self._float32():  # after the bf16 kernels: nothing added to their path
            return F.linear(x, self._dense_packed_order(torch.float32))
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, self.group_size, self.scales_and_zeros)

    def _float32(self) -> bool:
        """Float32 scales (WSLM_QUANT_FLOAT32=1, int8.compute_dtype): the exact path, where the weight is
        expanded to float32 for one GEMM per call: what transformers computes on the dequantized weight (the
        expansion is exact: fl(m + q * d), gguf's own formula), and 2-3x faster than torch's float32 int4
        kernel, a scalar loop (6 chats of the demo on a loaded 2-core EPYC: 1.5 s a decode step, not 3.9)."""
        return self.scales_and_zeros.dtype == torch.float32 and self.packed.device.type == "cpu"

    def _c_ok(self) -> bool:
        """Whether cpu_gemv's int4 kernels read this weight (built here, a pack layout they know, bf16
        scales, no act-order permutation); decided once."""
        if self._ours is None:
            self._ours = (
                self.perm is None and self.unpackable
                and cpu_gemv.int4_mv_takes(self.packed, self.scales_and_zeros, self.group_size, self.block_n)
            )  # fmt: skip
        return self._ours

    def kernel(self) -> WeightKernel:
        """What the back ends read (quant/kernel.py): torch's CPU int4 pack with a (scale, zero) per group, the
        activation permutation of act-order weights; mm is the product apply runs for fewer than DENSE_ROWS
        rows in the scales' dtype (none for act-order weights: apply permutes first)."""
        buffers = {"packed": self.packed, "scales_and_zeros": self.scales_and_zeros}
        if self.perm is not None:
            buffers["perm"] = self.perm
        return WeightKernel(
            "int4", self.out_features, self.in_features, buffers, group=self.group_size, block=self.block_n,
            dtype=self.scales_and_zeros.dtype, c_kernel=self._c_ok(), mm=self._rows if self.perm is None else None,
            mm_rows=DENSE_ROWS,
        )  # fmt: skip

    def _dense_packed_order(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """[N, K] in the pack's column order (act-order GPTQ: the sorted one)."""
        return dequantize_packed(
            self.packed, self.scales_and_zeros, self.out_features, self.in_features, self.group_size, dtype,
            self.block_n,
        )

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight in the checkpoint's column order, unpacked (CPU) or read back through the kernel."""
        if self.unpackable:
            w = self._dense_packed_order(torch.float32)
            if self.perm is not None:
                w = torch.empty_like(w).index_copy_(1, self.perm, w)
            return w.to(dtype)
        eye = torch.eye(self.in_features, dtype=self.scales_and_zeros.dtype, device=self.packed.device)
        saved, self.perm = self.perm, None
        try:
            w = self.apply(eye).t()
        finally:
            self.perm = saved
        if saved is not None:
            w = torch.empty_like(w).index_copy_(1, saved, w)
        return w.to(dtype)


def pick_group_size(in_features: int, preferred: int = 128) -> int:
    """The preferred group size, or the largest smaller one that divides in_features."""
    for g in sorted((g for g in GROUP_SIZES if g <= preferred), reverse=True):
        if in_features % g == 0:
            return g
    raise ValueError(f"int4 needs in_features divisible by 32; this weight has {in_features}.")


def quantize_int4_codes(w: torch.Tensor, group_size: int) -> Int4Codes:
    """Asymmetric min/max int4 of a dense [N, K] weight, one (scale, zero) per group."""
    n, k = w.shape
    g = w.float().reshape(n, k // group_size, group_size)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    scale = ((hi - lo) / 15.0).clamp(min=1e-10)
    q = torch.round((g - lo.unsqueeze(-1)) / scale.unsqueeze(-1)).clamp(0, 15).to(torch.uint8)
    return Int4Codes(q.reshape(n, k), scale, lo + 8.0 * scale, group_size)


def quantize_int4(w: torch.Tensor, group_size: int, device: torch.device | None = None,
                  dtype: torch.dtype = torch.bfloat16) -> Int4Weight:
    return quantize_int4_codes(w, group_size).pack(device or w.device, dtype)
