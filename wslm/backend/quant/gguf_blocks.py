"""GGUF weights kept in the file's own block formats, as views of the memory-mapped file (no copy, no repack).

A weight is one or more parts (a fused q|k|v or gate|up keeps each projection's tensor where it lies in the
file; a Q4_K_M file mixes Q4_K and Q6_K inside one layer), each part a uint8 tensor [rows, bytes per row]
of the file's blocks plus its ggml type id. The layout is the file's, byte for byte, so any back end (the
CPU kernels of kernels/cpu_gguf.c here, GPU kernels later) reads the same tensors; `dequantize_reference`
is the torch reference every back end is checked against (it equals gguf-py's dequantize).

llama.cpp's converter stores the q and k rows of Llama/Mistral permuted (each head's two rotary halves
interleaved). Rows left in the mapped file cannot be reordered without copying them, so the weight carries
`index`, the output position of each stored row, and the kernels write each row's result there: one
indexed store per output value. The alternatives cost more or touch more: permuting the projection's
output afterwards is a gather over q and k each step; running RoPE in the interleaved (GPT-J) order on the
permuted rows would be free in the products but change every rotary kernel (torch, Triton, the C step, the
compiled graph) and the KV cache's layout for these files alone.

Types outside BLOCK_TYPES keep gguf_weights.py's repacked forms; so do GPU engines for now (to_runtime
converts a weight there, until the GPU kernels for these blocks land)."""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from wslm.backend.quant.gguf_formats import BLOCK_FORMATS
from wslm.backend.quant.kernel import WeightKernel

# ggml type id -> (name, columns per block, bytes per block)
BLOCKS: dict[int, tuple[str, int, int]] = {t: (name, cols, size) for name, (t, cols, size) in BLOCK_FORMATS.items()}
BLOCK_TYPES = tuple(name for name, _, _ in BLOCKS.values())  # the types kept in place
TYPE_IDS = {name: t for t, (name, _, _) in BLOCKS.items()}
_BITS = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q8_0": 8, "Q4_K": 4, "Q5_K": 5, "Q6_K": 6}
MAX_PARTS = 4  # parts of one fused weight (kernels/cpu_gguf.c's GGUF_PARTS)
# From this many activation rows (prefill, big batches), where the tiled block GEMM (kernels/cpu_gguf_gemm.c,
# from its MIN_ROWS) is not built, slices of the weight are dequantized once and multiplied by torch's GEMM;
# fewer rows: the block kernel, which reads each weight block once for all of them. Measured on a Zen 3 core (AVX2, CPU time of one thread, 3072x3072): the kernel 45-50 GFLOP/s at any
# row count (Q4_K, Q6_K; Q4_0 37-40), dequantized slices + torch's float32 GEMM 12 at 8 rows, 40-46 at
# 32-64, 54-59 at 512.
PREFILL_ROWS = 64
_SLICE_FLOATS = 8 << 20  # float32 values of one dequantized slice (32 MB)
_DENSE_ROWS = 4096  # rows dequantized at once where no kernel runs (the fallback product, embedding rows)
_KERNEL_DTYPES = (torch.bfloat16, torch.float32)  # the activations the kernel reads as they are
_cpu_gguf = None  # wslm.kernels.cpu_gguf, imported on first use


def _kernels():
    global _cpu_gguf
    if _cpu_gguf is None:
        from wslm.kernels import cpu_gguf

        _cpu_gguf = cpu_gguf
    return _cpu_gguf


def row_bytes(ggml_type: int, cols: int) -> int:
    _, block, size = BLOCKS[ggml_type]
    if cols % block:
        raise ValueError(f"{BLOCKS[ggml_type][0]} rows need a multiple of {block} columns, got {cols}")
    return cols // block * size


# ---- the reference dequantizer (torch, float32) ------------------------------------------------------------
def _f16(b: torch.Tensor) -> torch.Tensor:
    """[..., 2] little-endian bytes -> [...] float32"""
    return b.contiguous().view(torch.float16).squeeze(-1).float()


def _scale_min_k4(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8 six-bit scales and minimums of K-quant super-blocks (s: [B, 12] uint8) -> two [B, 8] int"""
    s = s.to(torch.int32)
    sc = torch.cat([s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)], dim=1)
    mn = torch.cat([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], dim=1)
    return sc, mn


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[B, 16] bytes -> [B, 32]: low nibbles (elements 0-15), then high (16-31)"""
    q = qs.to(torch.int32)
    return torch.cat([q & 0xF, q >> 4], dim=1)


def _fifth_bit(qh: torch.Tensor) -> torch.Tensor:
    """[B, 4] bytes (a little-endian uint32) -> [B, 32] of 0 / 16"""
    h = qh.to(torch.int64)
    v = h[:, 0] | (h[:, 1] << 8) | (h[:, 2] << 16) | (h[:, 3] << 24)
    return (((v.unsqueeze(1) >> torch.arange(32)) & 1) << 4).to(torch.int32)


def dequantize_reference(raw: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """raw: uint8 [rows, bytes per row] (or flat) of one GGML block type -> float32 [rows, cols]: what
    gguf-py's gguf.quants.dequantize gives, in torch."""
    name, cols, size = BLOCKS[ggml_type]
    raw = raw.reshape(-1, raw.shape[-1]) if raw.dim() > 1 else raw.reshape(1, -1)
    rows = raw.shape[0]
    b = raw.reshape(-1, size)
    if name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        d = _f16(b[:, 0:2]).unsqueeze(1)
        if name == "Q8_0":
            w = b[:, 2:].view(torch.int8).float() * d
        elif name == "Q4_0":
            w = (_nibbles(b[:, 2:18]) - 8).float() * d
        elif name == "Q4_1":
            w = _nibbles(b[:, 4:20]).float() * d + _f16(b[:, 2:4]).unsqueeze(1)
        elif name == "Q5_0":
            w = ((_nibbles(b[:, 6:22]) | _fifth_bit(b[:, 2:6])) - 16).float() * d
        else:
            w = (_nibbles(b[:, 8:24]) | _fifth_bit(b[:, 4:8])).float() * d + _f16(b[:, 2:4]).unsqueeze(1)
        return w.reshape(rows, -1)
    if name in ("Q4_K", "Q5_K"):
        d, dmin = _f16(b[:, 0:2]).unsqueeze(1), _f16(b[:, 2:4]).unsqueeze(1)
        sc, mn = _scale_min_k4(b[:, 4:16])
        qs = b[:, 48:176] if name == "Q5_K" else b[:, 16:144]
        q = qs.to(torch.int32).reshape(-1, 4, 1, 32) >> torch.tensor([0, 4]).reshape(1, 1, 2, 1)
        q = (q & 0xF).reshape(-1, 8, 32)
        if name == "Q5_K":
            qh = b[:, 16:48].to(torch.int32).reshape(-1, 1, 32)
            q = q | (((qh >> torch.arange(8).reshape(1, 8, 1)) & 1) << 4)
        w = (d * sc.float()).unsqueeze(-1) * q.float() - (dmin * mn.float()).unsqueeze(-1)
        return w.reshape(rows, -1)
    # Q6_K: ql [128], qh [64], 16 int8 scales, d
    ql, qh = b[:, 0:128].to(torch.int32), b[:, 128:192].to(torch.int32)
    sc = b[:, 192:208].view(torch.int8).float()
    d = _f16(b[:, 208:210]).unsqueeze(1)
    ql = ql.reshape(-1, 2, 1, 64) >> torch.tensor([0, 4]).reshape(1, 1, 2, 1)  # [B, half, lo/hi, 64]
    ql = (ql & 0xF).reshape(-1, 2, 4, 32)  # [B, half, (l0, l1, h0, h1), 32]
    qh = (qh.reshape(-1, 2, 1, 32) >> torch.tensor([0, 2, 4, 6]).reshape(1, 1, 4, 1)) & 3
    q = (ql | (qh << 4)) - 32  # [B, half, 4, 32]: element 128 half + 32 i + l
    w = d.reshape(-1, 1, 1, 1, 1) * sc.reshape(-1, 2, 4, 2, 1) * q.float().reshape(-1, 2, 4, 2, 16)
    return w.reshape(rows, -1)


# ---- the weight ------------------------------------------------------------------------------------------
class GGUFBlockWeight:
    """A linear weight [out_features, in_features] as GGUF blocks in place (registry kind "gguf"): parts in
    output-row order, each (ggml type id, uint8 [rows, bytes per row]); index: int32 [out_features], the
    output position of each stored row (q/k of Llama-family files), or None."""

    __slots__ = ("parts", "index", "out_features", "in_features", "_c", "_ours", "name", "_dtype", "_graph")
    kind = "gguf"  # registry.WEIGHT_CLASSES

    def __init__(self, parts: list[tuple[int, torch.Tensor]], in_features: int,
                 index: torch.Tensor | None = None, name: str = "") -> None:  # fmt: skip
        for t, raw in parts:
            if raw.dim() != 2 or raw.dtype != torch.uint8 or raw.shape[1] != row_bytes(t, in_features):
                raise ValueError(f"GGUF {BLOCKS[t][0]} part of {name or 'a weight'}: {tuple(raw.shape)} bytes do "
                                 f"not hold rows of {in_features} columns")  # fmt: skip
        self.parts = parts
        self.in_features = in_features
        self.out_features = sum(raw.shape[0] for _, raw in parts)
        self.index = index
        self.name = name
        self._c = None  # the C view, built on first use
        self._ours: bool | None = None  # _c_ok(), once decided
        self._dtype = torch.bfloat16  # the model's activations' dtype (to_runtime)
        self._graph = None  # the repacked form (kernel().repacked), made once when asked

    # ---- what the engine asks (registry.QuantizedWeight) ----
    @property
    def bits(self) -> int:
        return max(_BITS[BLOCKS[t][0]] for t, _ in self.parts)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.out_features, self.in_features))

    @property
    def nbytes(self) -> int:
        return sum(raw.numel() for _, raw in self.parts)

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(BLOCKS[t][0] for t, _ in self.parts)

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if (self._ours and bias is None and x.dim() == 2 and x.shape[0] < PREFILL_ROWS and x.is_cpu
                and x.dtype in _KERNEL_DTYPES and x.is_contiguous()):  # fmt: skip
            # decode rows: straight to the kernel (each torch call a product does not need costs ~1-2 us,
            # as much as a small matrix's product)
            return _kernels().mm(x, self._c or self.c_struct())
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if not (self._c_ok() and x.device.type == "cpu"):
            out = self._fallback(x2)
        elif x2.shape[0] >= PREFILL_ROWS and not self._gemm():
            out = self._prefill(x2)
        else:
            out = self._mm(x2)
        out = out.reshape(*shape[:-1], self.out_features)
        return out if bias is None else out + bias

    def _mm(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        from wslm.kernels import cpu_gguf

        if x.dtype not in (torch.bfloat16, torch.float32):
            return cpu_gguf.mm(x.float().contiguous(), self.c_struct()).to(out_dtype or x.dtype)
        return cpu_gguf.mm(x.contiguous(), self.c_struct(), out_dtype)

    def logits(self, x: torch.Tensor, float32: bool = False) -> torch.Tensor | None:
        """An LM head's logits, float32 from the kernel's fp32 sums (never rounded to the activations'
        dtype); None where the kernel does not run (linear.head_logits then applies the weight)."""
        if not (self._c_ok() and x.device.type == "cpu" and x.dim() == 2):
            return None
        return self._mm(x, torch.float32)

    def _gemm(self) -> bool:
        """Whether cpu_gguf.mm takes many rows to the tiled block GEMM (kernels/cpu_gguf_gemm.c): 1.6-4x the
        dequantized slices + torch's float32 GEMM at 512 rows on a Zen 4 core (bench/gguf_gemm.py)."""
        from wslm.kernels import cpu_gguf_gemm

        return cpu_gguf_gemm.takes(self.c_struct())

    def _prefill(self, x: torch.Tensor) -> torch.Tensor:
        """Many rows: the weight dequantized a slice of rows at a time (C, the file's exact values), each slice
        multiplied by torch's GEMM in the activations' dtype."""
        from wslm.kernels import cpu_gguf

        s, n = self.c_struct(), self.out_features
        out = torch.empty(x.shape[0], n, dtype=x.dtype)
        index = None if self.index is None else self.index.long()
        step = max(16, _SLICE_FLOATS // self.in_features)
        for n0 in range(0, n, step):
            n1 = min(n, n0 + step)
            w = cpu_gguf.dequant(s, n0, n1)
            part = F.linear(x, w if x.dtype == torch.float32 else w.to(x.dtype))
            if index is None:
                out[:, n0:n1] = part
            else:
                out.index_copy_(1, index[n0:n1], part)
        return out

    def _fallback(self, x: torch.Tensor) -> torch.Tensor:
        """No C kernel here: the product on the dequantized weight, a slice of rows at a time."""
        outs = [F.linear(x, w.to(device=x.device, dtype=x.dtype)) for w in self._dense_slices()]
        out = torch.cat(outs, dim=-1)
        if self.index is not None:
            out = torch.empty_like(out).index_copy_(-1, self.index.to(device=out.device, dtype=torch.long), out)
        return out

    def _dense_slices(self):
        for t, raw in self.parts:
            for r in range(0, raw.shape[0], _DENSE_ROWS):
                yield dequantize_reference(raw[r : r + _DENSE_ROWS], t)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        w = torch.cat(list(self._dense_slices()))
        if self.index is not None:
            w = torch.empty_like(w).index_copy_(0, self.index.long(), w)
        return w.to(dtype)

    def _c_ok(self) -> bool:
        """Whether cpu_gguf's kernels are built here and take every part (decided once)."""
        if self._ours is None:
            from wslm.kernels import cpu_gguf

            self._ours = cpu_gguf.takes(self)
        return self._ours

    def kernel(self) -> WeightKernel:
        """What the back ends read (quant/kernel.py): the C struct of the blocks in place where the kernels are
        built here; mm is apply (the block kernel serves any row count, each weight row read once for all).
        repacked: the int4 / int8 form the loader gave before, for a back end that reads no blocks (the
        compiled batch graph, which freezes a copy of its weights anyway and was tuned with those kernels)."""
        ours = self._c_ok()
        return WeightKernel("gguf", self.out_features, self.in_features, {"blocks": self.c_struct()} if ours else {},
                            c_kernel=ours, mm=self.apply, mm_rows=1 << 30, repacked=self._repacked)  # fmt: skip

    def _repacked(self):
        """The repacked form (its weights and, for a token table, its rows), made once: a graph's buffers are
        these very tensors, one copy, not two."""
        from wslm.backend.quant.linear import finalize

        if self._graph is None:
            self._graph = finalize(self.legacy(), torch.device("cpu"), self._dtype)
        return self._graph

    def c_struct(self) -> ctypes.Structure:
        if self._c is None:
            from wslm.kernels import cpu_gguf

            self._c = cpu_gguf.struct_for(self)
        return self._c

    @classmethod
    def fuse(cls, parts: list) -> GGUFBlockWeight | None:
        return fuse_blocks(parts)

    # ---- loading ----
    def take_rows(self, rows: torch.Tensor) -> GGUFBlockWeight:
        """The weight with output row i = this weight's row rows[i] (GGUF's q/k order undone), without
        moving a byte: the index says where each stored row's result goes."""
        inverse = torch.empty_like(rows)
        inverse[rows] = torch.arange(rows.numel())
        current = torch.arange(self.out_features) if self.index is None else self.index.long()
        return GGUFBlockWeight(self.parts, self.in_features, inverse[current].to(torch.int32), self.name)

    def shard(self, dim: int, start: int, length: int) -> GGUFBlockWeight:
        """Output rows (dim 0) or input columns holding whole blocks (dim 1); copies (tensor parallelism)."""
        if dim == 1:
            parts = []
            for t, raw in self.parts:
                block, size = BLOCKS[t][1:]
                if start % block or length % block:
                    raise ValueError(
                        f"Tensor parallelism splits a GGUF {BLOCKS[t][0]} weight's {self.in_features} input columns "
                        f"into shards of {length} (columns {start}-{start + length - 1} on this rank), inside its "
                        f"blocks of {block}: pick a --tensor-parallel-size that leaves whole blocks on each rank.")  # fmt: skip
                parts.append((t, raw[:, start // block * size : (start + length) // block * size].contiguous()))
            return GGUFBlockWeight(parts, length, self.index, self.name)
        w = self if self.index is None else self._materialized_rows()
        parts, offset = [], 0
        for t, raw in w.parts:
            a, b = max(start - offset, 0), min(start + length - offset, raw.shape[0])
            if a < b:
                parts.append((t, raw[a:b].contiguous()))
            offset += raw.shape[0]
        return GGUFBlockWeight(parts, self.in_features, None, self.name)

    def _materialized_rows(self) -> GGUFBlockWeight:
        """The rows copied into output order (tensor parallelism only: the index cannot be split)."""
        order = torch.empty(self.out_features, dtype=torch.long)
        order[self.index.long()] = torch.arange(self.out_features)
        types = {t for t, _ in self.parts}
        if len(types) != 1:
            raise ValueError("a row-permuted GGUF weight of mixed types cannot be split across ranks")
        raw = torch.cat([r for _, r in self.parts])[order]
        return GGUFBlockWeight([(self.parts[0][0], raw)], self.in_features, None, self.name)

    def embedding(self, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Rows of a token table (one part, in order): only the asked rows are dequantized."""
        t, raw = self.parts[0]
        flat = ids.reshape(-1).to(torch.long)
        return dequantize_reference(raw.index_select(0, flat.cpu()), t).to(device=ids.device, dtype=dtype).reshape(
            *ids.shape, self.in_features)  # fmt: skip

    def legacy(self):
        """The repacked form gguf_weights.py gives these types elsewhere (int4 codes / int8): GPU engines."""
        import gguf

        from wslm.backend.quant.gguf_convert import convert_tensor
        from wslm.backend.quant.linear import fuse_rows

        table = self.name in ("token_embd.weight", "output.weight")  # tables go to int8, never int4
        forms = [
            convert_tensor(raw.numpy(), gguf.GGMLQuantizationType(t), (raw.shape[0], self.in_features), False, table,
                     self.name)
            for t, raw in self.parts
        ]  # fmt: skip
        w = forms[0] if len(forms) == 1 else fuse_rows(forms)
        if self.index is not None:
            order = torch.empty(self.out_features, dtype=torch.long)
            order[self.index.long()] = torch.arange(self.out_features)
            w = w[order] if isinstance(w, torch.Tensor) else w.take_rows(order)
        return w

    def to_runtime(self, device: torch.device, dtype: torch.dtype):
        """CPU: itself (the kernels read the blocks in place); elsewhere, and on a CPU where the C kernels
        cannot be built (no compiler, WSLM_CPU_KERNELS=0: each product would dequantize the weight), the
        repacked forms, until the GPU kernels for these blocks land."""
        if device.type == "cpu" and self._c_ok():
            self._dtype = dtype
            return self
        from wslm.backend.quant.linear import finalize

        return finalize(self.legacy(), device, dtype)


def fuse_blocks(parts: list) -> GGUFBlockWeight | None:
    """Block weights fused along output rows as one (linear.fuse_rows asks), or None when they are not all
    blocks or have more parts than a fused weight holds."""
    if all(isinstance(p, GGUFBlockWeight) for p in parts) and sum(len(p.parts) for p in parts) <= MAX_PARTS:
        return cat_blocks(parts)
    return None


def cat_blocks(parts: list[GGUFBlockWeight]) -> GGUFBlockWeight:
    """Weights fused along output rows (q|k|v, gate|up): their parts side by side, nothing copied."""
    all_parts, indices, offset = [], [], 0
    for p in parts:
        all_parts += p.parts
        idx = torch.arange(p.out_features, dtype=torch.int32) if p.index is None else p.index
        indices.append(idx + offset)
        offset += p.out_features
    index = None if all(p.index is None for p in parts) else torch.cat(indices)
    return GGUFBlockWeight(all_parts, parts[0].in_features, index, "+".join(p.name for p in parts))
