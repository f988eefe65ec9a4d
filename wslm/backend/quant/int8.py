"""int8 weight-only, one scale per output channel: w[n, k] = q[n, k] * scale[n].

CPU: aten._weight_int8pack_mm, which is fast only with bf16 activations, on CPUs without AVX512-BF16 too
(fp32 activations take a scalar fallback: 10x slower, see compute_dtype), so activations go in as bf16 and
the result comes back in the model's dtype. CUDA has no such kernel in torch: there the weight is
dequantized per call (memory is still saved; the multiply is the model dtype's GEMM)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from wslm import envs
from wslm.backend.quant.kernel import WeightKernel
from wslm.kernels import cpu_gemv

# aten._weight_int8pack_mm runs one matrix-vector product per activation row (3072x576, one thread:
# 0.17 ms at 1 row, 1.6 ms at 32, 6.3 ms at 128), while expanding the weight to bf16 and one GEMM costs
# ~1.2 ms whatever the rows: from DENSE_ROWS rows (prefill, big decode batches) the GEMM runs.
# WSLM_INT8_DENSE_ROWS overrides (0: always the kernel).
_DENSE_ENV: int | None = envs.WSLM_INT8_DENSE_ROWS  # a constant: read on the hot path
DENSE_ROWS = (32 if _DENSE_ENV is None else _DENSE_ENV) or 1 << 62
_EXPAND_ROWS = 4096


@functools.cache
def dense_rows() -> int:
    """From how many rows apply expands the weight for one GEMM: DENSE_ROWS where the CPU has AMX; 48
    elsewhere, where cpu_gemv's kernel wins up to there (32 rows of the demo's 49152-row head on a Zen 4
    core: 20 ms against 32 expanded). WSLM_INT8_DENSE_ROWS, where set, decides."""
    return DENSE_ROWS if _DENSE_ENV is not None or cpu_gemv.amx() else 48


class Int8Weight:
    __slots__ = ("qweight", "scales", "out_features", "in_features", "_ours")
    bits = 8
    kind = "int8"  # registry.WEIGHT_CLASSES

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor) -> None:
        self.qweight = qweight.contiguous()  # [N, K] int8
        self.scales = scales  # [N], in the activations' compute dtype
        self.out_features, self.in_features = qweight.shape
        self._ours: bool | None = None  # cpu_gemv takes this weight (decided on the first decode rows)

    @property
    def shape(self) -> torch.Size:
        return self.qweight.shape

    @property
    def nbytes(self) -> int:
        return self.qweight.numel() + self.scales.numel() * self.scales.element_size()

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if x.device.type == "cpu":
            if x.dim() == 2 and x.shape[0] < dense_rows() and x.is_contiguous():
                if x.dtype == self.scales.dtype:
                    out = self._rows(x)  # decode: the kernel alone
                    return out if bias is None else out + bias
                if x.dtype == torch.float32:  # a float32 engine (CPUs without bf16): the kernel's dtype and back
                    out = self._rows(x.to(self.scales.dtype)).to(x.dtype)
                    return out if bias is None else out + bias
            shape = x.shape
            x2 = x.reshape(-1, shape[-1])
            if x2.shape[0] >= dense_rows():  # prefill, big batches: expand slices, one GEMM each
                out = self._expanded_mm(x2)
            else:
                out = torch.ops.aten._weight_int8pack_mm(x2.to(self.scales.dtype), self.qweight, self.scales)
            out = out.to(x.dtype).reshape(*shape[:-1], self.out_features)
        else:
            out = F.linear(x, self.dequantize(x.dtype))
        return out if bias is None else out + bias

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """x @ w.T for decode rows on CPU (2-D, contiguous, in the scales' dtype, fewer than dense_rows()):
        cpu_gemv's kernel up to its rows_limit() where it is built, else torch's. apply and the back ends
        (through kernel().mm) both call this, so they pick the same kernel."""
        if self._ours is None:
            self._ours = self._c_ok()
        if self._ours and 0 < x.shape[0] <= cpu_gemv.rows_limit():
            return cpu_gemv.int8_mm(x, self.qweight, self.scales)
        return torch.ops.aten._weight_int8pack_mm(x, self.qweight, self.scales)

    def logits(self, x: torch.Tensor, float32: bool = False) -> torch.Tensor | None:
        """As an LM head: float32 logits from unrounded sums. A few rows on CPU get them straight from
        cpu_gemv's sums at no cost (the bf16 result apply gives rounds them: on the demo a mean KL of 0.0004
        nats from the float32 model's distribution, docs/benchmarks.md); any rows when float32 is asked
        (prompt_logprobs steps), the weight expanded to float32 a slice at a time. None otherwise: apply's
        product, in the activations' dtype, serves."""
        if self._few_rows(x):
            return cpu_gemv.int8_mm(x.to(torch.bfloat16), self.qweight, self.scales, out_dtype=torch.float32)
        if float32:
            return self._expanded_mm(x.reshape(-1, x.shape[-1]).float()).reshape(*x.shape[:-1], -1)
        return None

    def _few_rows(self, x: torch.Tensor) -> bool:
        """Whether cpu_gemv's float32-output kernel takes x (the rows apply would give its kernel)."""
        if x.device.type != "cpu" or x.dim() != 2 or not x.is_contiguous() or x.dtype not in (torch.bfloat16, torch.float32):
            return False
        if x.dtype == torch.float32 and self.scales.dtype != torch.bfloat16:
            return False  # WSLM_QUANT_FLOAT32: apply multiplies in float32 already
        if self._ours is None:
            self._ours = self._c_ok()
        return bool(self._ours) and 0 < x.shape[0] <= min(cpu_gemv.rows_limit(), dense_rows() - 1)

    def _c_ok(self) -> bool:
        """Whether cpu_gemv's int8 kernel takes this weight. Not cached: _rows keeps its own answer."""
        return cpu_gemv.int8_mm_takes(self.qweight, self.scales)

    def kernel(self) -> WeightKernel:
        """What the back ends read (quant/kernel.py): int8 rows with a scale each; mm is the product apply
        runs for fewer than dense_rows() rows in the scales' dtype."""
        return WeightKernel("int8", self.out_features, self.in_features, {"qweight": self.qweight, "scales": self.scales},
                            dtype=self.scales.dtype, c_kernel=self._c_ok(), mm=self._rows, mm_rows=dense_rows())  # fmt: skip

    def shard(self, dim: int, start: int, length: int) -> Int8Weight:
        """Output rows (dim 0) with their scales, or input columns (dim 1) with every row's scale."""
        end = start + length
        if dim == 0:
            return Int8Weight(self.qweight[start:end], self.scales[start:end])
        return Int8Weight(self.qweight[:, start:end], self.scales)

    def append_zero_rows(self, missing: int) -> Int8Weight:
        return Int8Weight(torch.cat([self.qweight, self.qweight.new_zeros(missing, self.shape[1])]),
                          torch.cat([self.scales, self.scales.new_zeros(missing)]))  # fmt: skip

    def take_rows(self, rows: torch.Tensor) -> Int8Weight:
        """The weight with its rows reordered, in place (GGUF's q/k permutation)."""
        self.qweight = self.qweight[rows].contiguous()
        self.scales = self.scales[rows].contiguous()
        return self

    def to_runtime(self, device: torch.device, dtype: torch.dtype) -> Int8Weight:
        """On the engine's device, scales in the kernels' dtype (linear.finalize)."""
        return Int8Weight(self.qweight.to(device), self.scales.to(device, compute_dtype(device, dtype)))

    def _expanded_mm(self, x2: torch.Tensor) -> torch.Tensor:
        """x2 @ w.T with w expanded to x2's dtype (float32 on CPUs without native bf16 GEMMs)
        _EXPAND_ROWS output rows at a time: each slice stays in cache and in the heap (a whole 49k-row
        table expanded at once page-faults ~56 MB every call)."""
        parts = []
        scales = self.scales.to(x2.dtype)
        for r in range(0, self.out_features, _EXPAND_ROWS):
            w = self.qweight[r : r + _EXPAND_ROWS].to(x2.dtype) * scales[r : r + _EXPAND_ROWS, None]
            parts.append(F.linear(x2, w))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.qweight.to(dtype) * self.scales.to(dtype).unsqueeze(1)

    def embedding(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows of an int8 embedding table (a tied lm_head shares it)."""
        return self.qweight.index_select(0, ids).to(dtype) * self.scales.index_select(0, ids).to(
            dtype
        ).unsqueeze(1)


def compute_dtype(device: torch.device, model_dtype: torch.dtype = torch.bfloat16) -> torch.dtype:
    """The dtype the quantized kernels take activations and scales in. CUDA: bf16 (tinygemm takes nothing
    else). CPU: bf16 by default, also in a float32 engine: torch's CPU int8/int4 kernels are vectorized for
    bf16 only, their float32 path is scalar (10x / 30x slower per call, ~9x per decode step of the demo
    GGUF; same under ATEN_CPU_CAPABILITY=avx2). WSLM_QUANT_FLOAT32=1 makes a float32 engine's quantized
    matmuls float32 end to end: nothing rounds to bf16, so tensor-parallel ranks' partial sums add up as one
    device's do (token-identical TP checks); read at load, so spawned TP workers inherit it."""
    if device.type == "cpu" and model_dtype == torch.float32 and envs.WSLM_QUANT_FLOAT32:
        return torch.float32
    return torch.bfloat16


def quantize_int8(w: torch.Tensor, device: torch.device | None = None) -> Int8Weight:
    """Symmetric per-output-channel int8 of a dense [N, K] weight."""
    w = w.float()
    scales = bf16_ceil(w.abs().amax(dim=1).clamp(min=1e-12) / 127.0)
    q = torch.round(w / scales.unsqueeze(1)).clamp(-127, 127).to(torch.int8)
    device = device or w.device
    return Int8Weight(q.to(device), scales.to(device=device, dtype=compute_dtype(device)))


def bf16_ceil(x: torch.Tensor) -> torch.Tensor:
    """Positive float32 values rounded up to the nearest bfloat16 value (as float32). The kernels read
    bf16 scales: a scale chosen in bf16 before the codes are is kept exactly, where rounding it after them
    moved every weight of its row by up to 2^-8 of the row's largest (twice int8's own half step)."""
    bits = x.float().contiguous().view(torch.int32)
    return ((bits + 0xFFFF) & ~0xFFFF).view(torch.float32)


def quantize_int8_chunks(chunks, shape: tuple[int, int], device: torch.device) -> Int8Weight:
    """quantize_int8 over row blocks of one weight, written into one preallocated result (a float copy
    of a big embedding never exists whole, nor do two int8 copies)."""
    qweight = torch.empty(shape, dtype=torch.int8)
    scales = torch.empty(shape[0], dtype=compute_dtype(device))
    row = 0
    for part in chunks:
        q = quantize_int8(part, torch.device("cpu"))
        qweight[row : row + part.shape[0]] = q.qweight
        scales[row : row + part.shape[0]] = q.scales
        row += part.shape[0]
    return Int8Weight(qweight.to(device), scales.to(device))
