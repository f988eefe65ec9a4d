"""Ahead-of-time compilation of the Triton kernels for a GPU that is not there.

`launches()` lists every distinct kernel launch the wrappers can make (their configs come from
wslm.kernels.configs, the functions the wrappers call) over dtypes, head dims, GQA groups, block sizes and
target GPUs; `compile_launch()` compiles one with triton.compile(ASTSource(...), target=GPUTarget(...))
(ptxas ships in the triton wheel) and reads the shared memory it needs (the kernel's metadata) and its
stack frame, which is where ptxas puts spilled registers (cuobjdump on the cubin, so results from
Triton's on-disk cache are read the same way). tests/test_kernels_compile.py runs them all.

    python tests/kernel_compile.py [-j N]      # prints a table, exits 1 on any failure"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from wslm.kernels import configs
from wslm.kernels.configs import Launch

HEAD_DIMS = (64, 128, 256)
GROUPS = (1, 4, 7)
BLOCK_SIZES = (16, 32)
_TRITON_TYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


@dataclass
class Result:
    launch: Launch
    shared: int = 0
    stack: int = 0
    registers: int = 0
    seconds: float = 0.0
    error: str | None = None

    @property
    def shared_limit(self) -> int:
        return configs.shared_memory_limit(self.launch.capability)

    def problems(self) -> list[str]:
        if self.error:
            return [f"compile error: {self.error}"]
        out = []
        if self.shared > self.shared_limit:
            out.append(f"needs {self.shared / 1024:.1f} KiB shared memory, the card allows "
                       f"{self.shared_limit / 1024:.0f} KiB")
        if self.stack:
            out.append(f"spills registers ({self.stack} bytes stack frame, {self.registers} registers)")
        return out


_INT_PTRS = {"block_tables_ptr": "i32", "cu_seqlens_q_ptr": "i32", "seq_lens_ptr": "i32",
             "slot_ptr": "i64", "pos_ptr": "i64"}


def _attention_launches(dtype: str, cc: tuple[int, int], head_dim: int, groups: int, block_size: int,
                        single: bool) -> list[Launch]:
    kernel = "triton_paged_attention:"
    f32 = ("sinks_ptr", "fp32"), ("part_out_ptr", "fp32"), ("part_lse_ptr", "fp32")
    floats = ("qk_scale", "cap_log2")
    # Window, soft cap and sinks all on: a superset of the plain kernel's work (its registers bound the
    # plain variant's), so one compile covers both.
    opts = (("SLIDING", True), ("SOFT_CAP", True), ("HAS_SINKS", True))
    out = []
    for max_q in (1, 512):  # decode-like rows in a mixed batch, and prefill
        c = configs.prefill_config(dtype, head_dim, groups, max_q, cc)
        consts = (
            ("NUM_GROUPS", groups), ("GROUP_PAD", c.group_pad), ("BLOCK_SIZE", block_size),
            ("HEAD_DIM", head_dim), ("HEAD_DIM_PAD", c.head_dim_pad), ("BLOCK_M", c.block_m),
            ("BLOCK_Q", c.block_m // c.group_pad), ("BLOCK_N", c.block_n), *opts,
            ("DOT_PRECISION", c.dot_precision),
        )
        out.append(Launch(kernel + "_prefill_kernel", dtype, consts, c.num_warps, c.num_stages, cc, f32, floats,
                          c.maxnreg))
    c = configs.decode_config(dtype, head_dim, groups, cc)
    consts = (
        ("NUM_GROUPS", groups), ("GROUP_PAD", c.group_pad), ("BLOCK_SIZE", block_size),
        ("HEAD_DIM", head_dim), ("HEAD_DIM_PAD", c.head_dim_pad), ("BLOCK_N", c.block_n),
        ("SINGLE_PARTITION", single), *opts, ("DOT_PRECISION", c.dot_precision),
    )
    out.append(Launch(kernel + "_decode_kernel", dtype, consts, c.num_warps, c.num_stages, cc, f32, floats))
    r = configs.decode_reduce_config(head_dim)
    consts = (("HEAD_DIM", head_dim), ("HEAD_DIM_PAD", r.head_dim_pad), ("PARTS_BLOCK", r.parts_block),
              ("SLIDING", single))
    out.append(Launch(kernel + "_decode_reduce_kernel", dtype, consts, r.num_warps, 1, cc, f32))
    return out


# (query heads, KV heads, head_dim, hidden): the demo, 8B-class GQA, 30B-A3B-class and Gemma-class shapes.
MODEL_SHAPES = ((9, 3, 64, 576), (32, 8, 128, 4096), (32, 4, 128, 2048), (16, 8, 256, 8192), (64, 8, 128, 8192))


def _small_launches(dtype: str, cc: tuple[int, int], shape: tuple[int, int, int, int], block_size: int,
                    flag: bool) -> list[Launch]:
    heads, kv_heads, head_dim, hidden = shape
    block, warps = configs.rms_norm_config(hidden)
    out = [Launch("triton_norm:_rms_norm_kernel", dtype, (("HAS_RESIDUAL", flag), ("BLOCK", block)), warps, 1,
                  cc, (), ("eps",))]
    q_pad, k_pad, half, warps = configs.rotary_config(heads, kv_heads, head_dim)
    consts = (("HAS_K", True), ("IS_NEOX", flag), ("Q_HEADS_PAD", q_pad), ("K_HEADS_PAD", k_pad), ("HALF_PAD", half))
    out.append(Launch("triton_rotary:_rotary_kernel", dtype, consts, warps, 1, cc, (("cache_ptr", "fp32"),)))
    h_pad, d_pad, warps = configs.cache_config(kv_heads, head_dim)
    consts = (("NUM_KV_HEADS", kv_heads), ("HEADS_PAD", h_pad), ("HEAD_DIM", head_dim), ("HEAD_DIM_PAD", d_pad),
              ("BLOCK_SIZE", block_size))
    out.append(Launch("triton_cache:_reshape_and_cache_kernel", dtype, consts, warps, 1, cc))
    return out


def resource_key(launch: Launch) -> tuple:
    """What decides a launch's shared memory and registers: the kernel, the target, the element size and
    the tile constexprs (padded sizes, tiles, precision), warps and stages. Launches that differ only in
    masks (true head_dim, group size, block size, 16-bit flavour) share a key."""
    mask_only = ("BLOCK_SIZE", "GROUP_PAD", "BLOCK_Q")  # index arithmetic, not tile sizes
    code = ("DOT_PRECISION", "QTYPE", "SPLIT_W")  # GGUF: each block type and weight split is its own code
    tile = tuple((k, v) for k, v in launch.constexprs
                 if k not in mask_only and (k.endswith("_PAD") or k.startswith("BLOCK") or k in code))
    # Attention and GGUF tiles go through shared memory (the element size matters); the reduce and the
    # small kernels compute in fp32 registers whatever the dtype.
    elt = 4 if launch.dtype == "float32" else 2
    if (("paged_attention" not in launch.kernel and "gguf" not in launch.kernel) or "reduce" in launch.kernel
            or "dequant" in launch.kernel):
        elt = 0
    return launch.kernel, launch.capability, elt, tile, launch.num_warps, launch.num_stages


def all_launches(targets=configs.TARGETS, dtypes=configs.DTYPES) -> list[Launch]:
    """The cross product the wrappers can be asked for: dtype x head_dim x GQA group x block size (x decode
    single/split, model shapes for the small kernels) per target, each through the config functions."""
    items = []
    for cc in targets:
        for dtype in dtypes:
            for head_dim in HEAD_DIMS:
                for groups in GROUPS:
                    for block_size in BLOCK_SIZES:
                        for single in (True, False):
                            items += _attention_launches(dtype, cc, head_dim, groups, block_size, single)
            for shape in MODEL_SHAPES:
                for block_size in BLOCK_SIZES:
                    for flag in (False, True):
                        items += _small_launches(dtype, cc, shape, block_size, flag)
    # MoE, GGUF block and LoRA kernels join here when present (wslm.kernels.triton_moe, triton_gguf, triton_lora).
    for module in ("triton_moe", "triton_gguf", "triton_lora"):
        try:
            extra = importlib.import_module(f"wslm.kernels.{module}").compile_launches
        except ImportError:
            continue
        for cc in targets:
            for dtype in dtypes:
                items += extra(dtype, cc)
    return items


def launches(targets=configs.TARGETS, dtypes=configs.DTYPES) -> list[Launch]:
    """One launch per resource key of the cross product: every configuration the wrappers can pick is
    compiled; the mask-only variations (group size, block size, fp16 vs bf16, single vs split) rotate
    across the keys so each value is compiled somewhere."""
    by_key: dict[tuple, list[Launch]] = {}
    for launch in all_launches(targets, dtypes):
        by_key.setdefault(resource_key(launch), []).append(launch)
    return [group[(i * 7) % len(group)] for i, group in enumerate(by_key.values())]


def _jit_function(kernel: str):
    module, name = kernel.split(":")
    return getattr(importlib.import_module(f"wslm.kernels.{module}"), name)


def _signature(fn, launch: Launch) -> dict[str, str]:
    ptr_types = dict(_INT_PTRS, **dict(launch.pointer_types))
    sig = {}
    for p in fn.params:
        if p.is_constexpr:
            sig[p.name] = "constexpr"
        elif p.name.endswith("_ptr"):
            sig[p.name] = "*" + ptr_types.get(p.name, _TRITON_TYPES[launch.dtype])
        elif p.name in launch.float_args:
            sig[p.name] = "fp32"
        else:
            sig[p.name] = "i32"
    return sig


def _attrs(fn) -> dict[tuple[int], list]:
    """What the JIT's specialisation marks at a real launch: torch's allocations are 16-byte aligned and the
    strides of the shapes we check are multiples of 16, so pointers and strides carry tt.divisibility=16
    (without it every element gets its own 64-bit pointer and the kernels look far heavier than they are)."""
    return {
        (i,): [["tt.divisibility", 16]]
        for i, p in enumerate(fn.params)
        if not p.is_constexpr and (p.name.endswith("_ptr") or p.name.startswith("stride") or p.name == "partition_size")
    }


def _tool(name: str) -> str:
    from triton.backends.nvidia.compiler import get_ptxas

    return os.path.join(os.path.dirname(get_ptxas(80).path), name)


def _resources(cubin: bytes) -> tuple[int, int]:
    """(registers, stack frame bytes) of the cubin's kernel, by cuobjdump."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        text = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", f.name], capture_output=True,
                              text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    regs = re.search(r"REG:(\d+)", text)
    stack = re.search(r"STACK:(\d+)", text)
    if not regs or not stack:
        raise RuntimeError(f"cuobjdump gave no resource usage: {text!r}")
    return int(regs.group(1)), int(stack.group(1))


def compile_launch(launch: Launch) -> Result:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = _jit_function(launch.kernel)
    result = Result(launch)
    start = time.perf_counter()
    try:
        src = ASTSource(fn, _signature(fn, launch), dict(launch.constexprs), _attrs(fn))
        cc = launch.capability[0] * 10 + launch.capability[1]
        options = {"num_warps": launch.num_warps, "num_stages": launch.num_stages}
        if launch.maxnreg:
            options["maxnreg"] = launch.maxnreg
        kernel = triton.compile(src, target=GPUTarget("cuda", cc, 32), options=options)
        result.shared = int(kernel.metadata.shared)
        result.registers, result.stack = _resources(kernel.asm["cubin"])
    except Exception as exc:  # a compile error is a result, reported with the launch that caused it
        result.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
    result.seconds = time.perf_counter() - start
    return result


def _init_worker() -> None:
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    os.environ.pop("TRITON_INTERPRET", None)


def compile_all(items: list[Launch], jobs: int | None = None) -> list[Result]:
    """Compiles every launch in `jobs` processes (default: the CPUs there are)."""
    jobs = jobs or os.cpu_count() or 1
    if jobs == 1:
        _init_worker()
        return [compile_launch(x) for x in items]
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # the interpreter flag of a test process must not leak in
    with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_init_worker) as pool:
        # Slowest first (attention kernels), so the pool does not end on one long compile.
        order = sorted(range(len(items)), key=lambda i: "paged_attention" not in items[i].kernel)
        results = dict(zip(order, pool.map(compile_launch, [items[i] for i in order], chunksize=1), strict=True))
    return [results[i] for i in range(len(items))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-j", "--jobs", type=int, default=None)
    parser.add_argument("-k", "--filter", default="", help="only launches whose label contains this")
    args = parser.parse_args(argv)
    items = [x for x in launches() if args.filter in x.label()]
    start = time.perf_counter()
    results = compile_all(items, args.jobs)
    bad = 0
    for r in results:
        problems = r.problems()
        bad += bool(problems)
        mark = "FAIL " + "; ".join(problems) if problems else "ok"
        print(f"{r.seconds:6.1f}s smem {r.shared / 1024:6.1f}K regs {r.registers:3d} {r.launch.label()}  {mark}")
    print(f"{len(results)} launches, {bad} failing, {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
