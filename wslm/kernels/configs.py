"""Launch configurations of the Triton kernels: pure functions of dtype, shapes and the GPU's compute
capability. The wrappers call them at launch and tests/test_kernels_compile.py compiles what they return
for sm_80/86/89/90 without a GPU (kernel_compile), so a tile that needs more shared memory
than a card has, or spills registers, fails a test on a machine with no GPU instead of a user's launch.

No torch or triton import here: dtypes are names ("float16", "bfloat16", "float32")."""

from __future__ import annotations

from dataclasses import dataclass, field

# Shared memory one block may use (opt-in maximum), bytes. sm_86/sm_89 (RTX 30/40) and the consumer
# Blackwell sm_120 have 99 KiB; A100 163 KiB; H100/H200 227 KiB.
SHARED_MEMORY_LIMITS = {(8, 0): 163 * 1024, (8, 7): 163 * 1024, (9, 0): 227 * 1024, (10, 0): 227 * 1024}
DEFAULT_SHARED_MEMORY = 99 * 1024
# The targets the compile test checks (what our users own, and the datacenter cards).
TARGETS = ((8, 0), (8, 6), (8, 9), (9, 0))
DTYPES = ("float16", "bfloat16", "float32")
# The interpreter (no GPU) and unknown devices plan for the smallest card.
INTERPRETER_CAPABILITY = (8, 6)


def shared_memory_limit(capability: tuple[int, int]) -> int:
    return SHARED_MEMORY_LIMITS.get(tuple(capability), DEFAULT_SHARED_MEMORY)


def next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _dtype_bytes(dtype: str) -> int:
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r} for the Triton kernels: use one of {DTYPES}")
    return 4 if dtype == "float32" else 2


def dot_precision(dtype: str, head_dim_pad: int = 128) -> str:
    """float32 attention keeps float32 accuracy (the engine's float32 must match HF's float32, which CUDA
    matmuls compute without TF32 by default): three TF32 products, or plain FMA ("ieee") for head_dim 256,
    where the split operands would not fit the registers. 16-bit inputs ignore it."""
    if dtype != "float32":
        return "tf32"
    return "ieee" if head_dim_pad > 128 else "tf32x3"


@dataclass(frozen=True)
class AttentionConfig:
    block_m: int  # query rows per program (prefill: tokens x GQA group); decode: group_pad
    block_n: int  # keys per tile
    num_warps: int
    num_stages: int
    group_pad: int
    head_dim_pad: int
    dot_precision: str
    # ptxas's register cap (None: its own choice). For 256-thread programs on sm_80 ptxas aims at two
    # programs per SM and caps registers at 128, which made the prefill tiles spill; 255 lets it use them.
    maxnreg: int | None = None


def prefill_config(
    dtype: str, head_dim: int, groups: int, max_seqlen_q: int, capability: tuple[int, int]
) -> AttentionConfig:
    """Tiles of the prefill/mixed kernel. Rows = query tokens x the heads of a GQA group: 16 rows for
    short (decode-like) runs, 64 for prefill; keys per tile shrink with head_dim and dtype so K, V (2
    pipeline stages, 3 on cards with 160+ KiB) and Q fit the card's shared memory and the accumulators
    fit the registers without spilling (checked by tests/test_kernels_compile.py for each target)."""
    elt = _dtype_bytes(dtype)
    group_pad = next_power_of_2(groups)
    head_dim_pad = next_power_of_2(head_dim)
    block_m = max(group_pad, 64 if max_seqlen_q * group_pad > 16 else 16)
    row = head_dim_pad * elt  # bytes of one row of K (or V)
    stages = 2
    if row <= 128:  # head_dim <= 64 in 16-bit, <= 32 in float32
        block_n, warps = 64, 4
    elif row <= 256:  # head_dim 128 in 16-bit, 64 in float32 (3 TF32 products: twice the operands)
        block_n, warps = (16, 8) if elt == 4 else (64, 8)
    elif row <= 512:  # head_dim 256 in 16-bit, 128 in float32
        block_n, warps = (16 if elt == 4 else 32), 8
        block_m = max(group_pad, min(block_m, 32))
    else:  # head_dim 256 in float32 (FMA dots): the smallest tiles, one stage
        block_n, warps, stages = 16, 8, 1
        block_m = max(group_pad, 16)
    if elt == 2 and row <= 256 and block_m == 64 and shared_memory_limit(capability) >= 160 * 1024:
        stages = 3  # A100/H100-class shared memory: one more K/V tile in flight for long prefills
    return AttentionConfig(
        block_m, block_n, warps, stages, group_pad, head_dim_pad, dot_precision(dtype, head_dim_pad), 255
    )


def decode_config(dtype: str, head_dim: int, groups: int, capability: tuple[int, int]) -> AttentionConfig:
    """Tiles of the split-KV decode kernel: the group's query heads padded to 16 rows (tl.dot's minimum)
    against BLOCK_N keys; BLOCK_N divides 64, the partition size's unit."""
    elt = _dtype_bytes(dtype)
    head_dim_pad = next_power_of_2(head_dim)
    group_pad = max(16, next_power_of_2(groups))
    row = head_dim_pad * elt
    block_n = 64 if row <= 256 else 32 if row <= 512 else 16
    warps = 8 if row > 512 else 4
    # Decode keeps 3 TF32 products at head_dim 256 in float32 (16 rows fit), unlike prefill.
    precision = "tf32x3" if dtype == "float32" else "tf32"
    return AttentionConfig(group_pad, block_n, warps, 2, group_pad, head_dim_pad, precision)


# The decode partitions' unit: every decode block_n divides it.
PARTITION_UNIT = 64


@dataclass(frozen=True)
class ReduceConfig:
    parts_block: int
    head_dim_pad: int
    num_warps: int


def decode_reduce_config(head_dim: int) -> ReduceConfig:
    return ReduceConfig(16, next_power_of_2(head_dim), 4)


def rms_norm_config(hidden: int) -> tuple[int, int]:
    """(BLOCK, num_warps): the whole row in registers, at most ~32 fp32 values per thread."""
    block = next_power_of_2(hidden)
    return block, max(4, min(16, block // 1024))


def lora_config(k: int, r: int, n: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_R, BLOCK_K, BLOCK_N, R_PAD, num_warps) of the LoRA shrink/expand kernels (triton_lora.py): at
    most 4096 fp32 values a tile (32 a thread: no spills, checked by tests/kernel_compile.py), the whole rank in
    one expand tile."""
    r_pad = next_power_of_2(max(r, 16))
    block_r = min(r_pad, 64)
    block_k = min(next_power_of_2(k), 128 if block_r <= 32 else 64)
    block_n = max(16, min(next_power_of_2(n), 4096 // r_pad))
    return block_r, block_k, block_n, r_pad, 4


def rotary_config(num_q_heads: int, num_k_heads: int, rot_dim: int) -> tuple[int, int, int, int]:
    """(Q_HEADS_PAD, K_HEADS_PAD, HALF_PAD, num_warps)."""
    q_pad, k_pad, half = next_power_of_2(num_q_heads), next_power_of_2(num_k_heads), next_power_of_2(rot_dim // 2)
    return q_pad, k_pad, half, 4 if q_pad * half <= 4096 else 8


def cache_config(num_kv_heads: int, head_dim: int) -> tuple[int, int, int]:
    """(HEADS_PAD, HEAD_DIM_PAD, num_warps) of reshape_and_cache."""
    heads, dim = next_power_of_2(num_kv_heads), next_power_of_2(head_dim)
    return heads, dim, 4 if heads * dim <= 4096 else 8


@dataclass(frozen=True)
class MoeConfig:
    block_m: int  # (token, expert) rows per program, all of one expert
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    dot_precision: str
    maxnreg: int | None = 255  # ptxas otherwise caps the 16-row tiles at 64 registers on sm_90 and spills


def moe_config(dtype: str, num_tokens: int, top_k: int, capability: tuple[int, int]) -> MoeConfig:
    """Tiles of the grouped expert GEMM: 16 rows when few tokens reach each expert (decode), 64 for
    prefill batches; 64 x 64 x 32 tiles (K halved in float32) fit every checked card's shared memory."""
    elt = _dtype_bytes(dtype)
    block_m = 64 if num_tokens * top_k >= 256 else 16
    block_k = 32 if elt == 4 else 64
    stages = 3 if block_m == 64 and shared_memory_limit(capability) >= 160 * 1024 else 2
    precision = "tf32x3" if elt == 4 else "tf32"
    return MoeConfig(block_m, 64, block_k, 4, stages, precision)


@dataclass(frozen=True)
class Launch:
    """One kernel compile: which kernel, its constexprs, launch options and target."""

    kernel: str  # "module:function" under wslm.kernels
    dtype: str
    constexprs: tuple[tuple[str, object], ...]
    num_warps: int
    num_stages: int
    capability: tuple[int, int]
    pointer_types: tuple[tuple[str, str], ...] = field(default=())  # overrides of the dtype for *_ptr args
    float_args: tuple[str, ...] = ()  # non-pointer fp32 arguments; other runtime arguments are i32
    maxnreg: int | None = None

    def label(self) -> str:
        consts = ",".join(f"{k}={v}" for k, v in self.constexprs)
        return (f"{self.kernel.split(':')[1]} {self.dtype} sm_{self.capability[0]}{self.capability[1]} "
                f"w{self.num_warps}s{self.num_stages} {consts}")


# GGUF block matmuls (triton_gguf). Activation rows up to this take the GEMV (decode) kernel.
GGUF_GEMV_MAX_ROWS = 32
GGUF_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
# Streaming multiprocessors to plan split-K for (the datacenter parts; consumer cards of an arch vary, and
# a split sized for more SMs than a card has only adds a few partial sums).
_SM_COUNTS = {(8, 0): 108, (8, 6): 84, (8, 7): 16, (8, 9): 128, (9, 0): 132, (10, 0): 148}


@dataclass(frozen=True)
class GgufConfig:
    block_m: int  # activation rows per program (1: the FMA GEMV; 16/32: padded rows for tl.dot)
    block_n: int  # weight rows (outputs) per program
    block_k: int
    num_warps: int
    num_stages: int
    dot_precision: str
    split_k: int = 1  # GEMV: K ranges per output tile (a runtime value, not a constexpr)
    split_w: bool = False  # GEMV dots: float32 weight as hi + lo in the 16-bit activation dtype
    group_m: int = 8  # GEMM: row tiles per program group (L2 reuse of a dequantized weight tile)
    # ptxas's register cap (None: its own). The dot GEMVs need 255: on sm_90 ptxas otherwise aims at more
    # programs per SM than their fp32 weight tile (+ its hi/lo split) leaves registers for, and spills.
    maxnreg: int | None = None


def _check_gguf_type(qtype: str) -> None:
    if qtype not in GGUF_TYPES:
        raise ValueError(f"GGUF type {qtype!r} has no Triton kernel: use one of {GGUF_TYPES}")


def gguf_gemv_config(qtype: str, dtype: str, rows: int, n: int, k: int, capability: tuple[int, int]) -> GgufConfig:
    """Decode tiles (rows <= GGUF_GEMV_MAX_ROWS). One row: a [128, 16] weight tile per step, float32
    FMAs; more rows: 16 or 32 padded rows x 64 outputs (32 in float32) x 64 K (32 for 32 rows)
    through tl.dot. The K axis splits until the programs cover ~4 waves of the SMs, keeping at least 4 K
    tiles per split (weight bytes are the cost, so every SM must stream)."""
    _check_gguf_type(qtype)
    elt = _dtype_bytes(dtype)
    if rows < 1 or rows > GGUF_GEMV_MAX_ROWS:
        raise ValueError(f"gguf_gemv_config: rows must be 1..{GGUF_GEMV_MAX_ROWS}, got {rows}")
    if rows == 1:
        block_m, block_n, block_k = 1, 16, 128
    else:  # float32's three TF32 products need twice the operands: 32 outputs; 32 rows: K 32 (Q6_K spilled)
        block_m = 16 if rows <= 16 else 32
        block_n = 32 if elt == 4 else 64
        block_k = 32 if block_m == 32 else 64
    tiles = -(-n // block_n)
    k_tiles = -(-k // block_k)
    target = 4 * _SM_COUNTS.get(tuple(capability), 84)
    split = 1
    while tiles * split < target and k_tiles // (split * 2) >= 4:
        split *= 2
    return GgufConfig(block_m, block_n, block_k, 4, 2, dot_precision(dtype), split,
                      split_w=block_m > 1 and elt == 2, maxnreg=255 if block_m > 1 else None)


def gguf_gemm_config(qtype: str, dtype: str, rows: int, n: int, k: int, capability: tuple[int, int]) -> GgufConfig:
    """Prefill tiles: 128 x 128 x 32 with 8 warps for long prompts in 16-bit (3 stages where the card has
    160+ KiB of shared memory), 64 x 64 x 64 otherwise; float32 (three TF32 products) halves K, 8 warps."""
    _check_gguf_type(qtype)
    elt = _dtype_bytes(dtype)
    big_smem = shared_memory_limit(capability) >= 160 * 1024
    if elt == 4:  # 8 warps and no register cap below 255: Q6_K's decode spilled with 4 warps or 128 registers
        return GgufConfig(64, 64, 32, 8, 2, dot_precision(dtype), maxnreg=255)
    if rows >= 256:
        return GgufConfig(128, 128, 32, 8, 3 if big_smem else 2, dot_precision(dtype))
    return GgufConfig(64, 64, 64, 4, 3 if big_smem else 2, dot_precision(dtype))


def gguf_dequant_config(qtype: str) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps) of the GGUF dequantize kernel: 8 rows x 256 weights per program."""
    _check_gguf_type(qtype)
    return 8, 256, 4
