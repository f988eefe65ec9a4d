"""Micro-benchmark of the GGUF block kernels (wslm/kernels/cpu_gguf.c) at real shapes, against the machine's
measured memory bandwidth.

For each block type, one decoder layer's matrices of Llama-3.2-3B (hidden 3072, intermediate 8192, 8 KV
heads of 128) and Llama-3.1-8B (4096 / 14336) as random block bytes (fp16 scales of realistic size): the
one-row product (decode) over the whole layer, at 1 and 2 threads, in GB/s of weight bytes read (each pass
reads the layer once; the layer is larger than the caches), beside the read bandwidth of a large torch
tensor (sum) and a copy; and the product of 512 rows (prefill) with the o projection in GFLOP/s: the block
kernel itself, the engine's path from gguf_blocks.PREFILL_ROWS rows (slices dequantized in C, then torch's
GEMM), and torch's float32 GEMM of the weight dequantized beforehand. Each number is the best of --repeat runs, with
os.getloadavg() at its time (the machine may be shared). Results: bench/results/gguf_kernels-<stamp>.json
and a section in docs/benchmarks-log.md (machine.append_section).

    python bench/gguf_kernels.py [--types Q4_K,Q6_K] [--models 3b,8b] [--repeat 5] [--no-docs]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import append_section, describe  # noqa: E402

from wslm.backend.quant.gguf_blocks import BLOCK_TYPES, BLOCKS, TYPE_IDS, GGUFBlockWeight  # noqa: E402
from wslm.kernels import cpu_gguf  # noqa: E402

# (hidden, intermediate, q heads, kv heads, head dim)
MODELS = {"3b": ("Llama-3.2-3B", 3072, 8192, 24, 8, 128), "8b": ("Llama-3.1-8B", 4096, 14336, 32, 8, 128)}
_FP16 = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2],
         "Q6_K": [208]}  # fmt: skip
PREFILL_ROWS = 512


def random_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator) -> torch.Tensor:
    _, block, size = BLOCKS[TYPE_IDS[kind]]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for off in _FP16[kind]:  # scales of weights' size (random bytes would hold infinities and NaNs)
        raw[..., off : off + 2] = rng.uniform(1e-4, 1e-3, raw.shape[:2]).astype(np.float16)[..., None].view(np.uint8)
    return torch.from_numpy(raw.reshape(rows, -1))


def layer(kind: str, model: str, rng: np.random.Generator) -> list[GGUFBlockWeight]:
    """q|k|v, o, gate|up, down of one layer, fused as the engine fuses them."""
    _, d, inter, heads, kv, hd = MODELS[model]
    t = TYPE_IDS[kind]
    shapes = [[heads * hd, kv * hd, kv * hd], [d], [inter, inter], [d]]
    widths = [d, heads * hd, d, inter]
    return [GGUFBlockWeight([(t, random_blocks(kind, rows, k, rng)) for rows in parts], k)
            for parts, k in zip(shapes, widths)]  # fmt: skip


CPU_TIMES: list[float] = []  # the process's CPU seconds of each best() winner (a shared machine's wall time lies)


def best(fn, repeat: int) -> tuple[float, list[float]]:
    """The fastest of repeat timed calls (after one warm-up), and the load average at its time; the CPU time
    of that call goes to CPU_TIMES."""
    fn()
    top, load, cpu = float("inf"), list(os.getloadavg()), 0.0
    for _ in range(repeat):
        start, cpu_start = time.perf_counter(), time.process_time()
        fn()
        took = time.perf_counter() - start
        if took < top:
            top, load, cpu = took, list(os.getloadavg()), time.process_time() - cpu_start
    CPU_TIMES.append(cpu)
    return top, [round(v, 2) for v in load]


def bandwidth(threads: int, repeat: int) -> dict:
    torch.set_num_threads(threads)
    big = torch.ones(1 << 28, dtype=torch.float32)  # 1 GiB
    dst = torch.empty_like(big)
    read, load_r = best(lambda: big.sum(), repeat)
    copy, load_c = best(lambda: dst.copy_(big), repeat)
    return {"read_gbs": round(big.nbytes / read / 1e9, 2), "read_load": load_r,
            "copy_gbs": round(2 * big.nbytes / copy / 1e9, 2), "copy_load": load_c}  # fmt: skip


def decode(weights: list[GGUFBlockWeight], threads: int, repeat: int) -> dict:
    xs = [torch.randn(1, w.in_features) for w in weights]
    structs = [w.c_struct() for w in weights]

    def one_pass():
        for x, s in zip(xs, structs):
            cpu_gguf.mm(x, s, threads=threads)

    took, load = best(one_pass, repeat)
    nbytes = sum(w.nbytes for w in weights)
    return {"gbs": round(nbytes / took / 1e9, 2), "ms": round(took * 1e3, 3), "cpu_ms": round(CPU_TIMES[-1] * 1e3, 3),
            "bytes": nbytes, "load": load}  # fmt: skip


def prefill(w: GGUFBlockWeight, threads: int, repeat: int) -> dict:
    x = torch.randn(PREFILL_ROWS, w.in_features)
    flops = 2 * PREFILL_ROWS * w.out_features * w.in_features
    torch.set_num_threads(threads)
    ours, load = best(lambda: cpu_gguf.mm(x, w.c_struct(), threads=threads), max(2, repeat // 2))
    applied, load_a = best(lambda: w.apply(x), max(2, repeat // 2))  # slices dequantized + torch's GEMM
    dense = w.dequantize(torch.float32)
    theirs, load_t = best(lambda: torch.nn.functional.linear(x, dense), max(2, repeat // 2))
    cpu = CPU_TIMES[-3:]  # per CPU-second: what the arithmetic reaches whatever else runs
    return {"gflops": round(flops / ours / 1e9, 1), "s": round(ours, 3), "load": load,
            "apply_gflops": round(flops / applied / 1e9, 1), "apply_load": load_a,
            "torch_f32_gflops": round(flops / theirs / 1e9, 1), "torch_load": load_t,
            "gflop_per_cpu_s": [round(flops / max(c, 1e-9) / 1e9, 1) for c in cpu]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="Q4_0,Q4_1,Q8_0,Q4_K,Q5_K,Q6_K")
    ap.add_argument("--models", default="3b,8b")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    if cpu_gguf.library() is None:
        sys.exit("the C kernels are not built here (see `wslm doctor`)")
    types = [t for t in args.types.split(",") if t in BLOCK_TYPES]
    threads = [int(t) for t in args.threads.split(",")]
    rng = np.random.default_rng(0)
    result = {"machine": describe(), "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "native": cpu_gguf.native(), "bandwidth": {}, "decode": [], "prefill": []}  # fmt: skip
    for n in threads:
        result["bandwidth"][n] = bandwidth(n, args.repeat)
        print("bandwidth", n, result["bandwidth"][n], flush=True)
    for model in args.models.split(","):
        for kind in types:
            weights = layer(kind, model, rng)
            for n in threads:
                torch.set_num_threads(n)
                row = {"model": MODELS[model][0], "type": kind, "threads": n, **decode(weights, n, args.repeat)}
                row["of_read_bw"] = round(row["gbs"] / result["bandwidth"][n]["read_gbs"], 3)
                result["decode"].append(row)
                print(row, flush=True)
                pre = {"model": MODELS[model][0], "type": kind, "threads": n, "shape": list(weights[1].shape),
                       **prefill(weights[1], n, args.repeat)}  # fmt: skip
                result["prefill"].append(pre)
                print(pre, flush=True)
            del weights
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    path = out / f"gguf_kernels-{datetime.datetime.now():%Y%m%d-%H%M}.json"
    path.write_text(json.dumps(result, indent=1))
    print("wrote", path)
    if not args.no_docs:
        append_section("GGUF block kernels (bench/gguf_kernels.py)", _table(result, path))


def _table(r: dict, path: Path) -> str:
    bw = r["bandwidth"]
    lines = [
        f"Random block bytes at real shapes, one decoder layer per pass (results: `{path.name}`); C kernels "
        f"{'AVX2' if r['native'] else 'plain C'}. Memory read bandwidth (torch sum of 1 GiB): "
        + ", ".join(f"{v['read_gbs']} GB/s at {n} thread{'s' if int(n) > 1 else ''} (load {v['read_load'][0]})"
                    for n, v in bw.items())
        + ". Every number: best of its runs, with the 1-minute load average at that run (the machine is shared).",
        "",
        "| model | type | threads | decode GB/s | of read bandwidth | layer ms (CPU ms) | load | 512 rows, block "
        "kernel GFLOP/s | 512 rows, dequantized slices + torch GEMM (the engine's path) | torch f32 GEMM, weight "
        "dequantized beforehand | the three per CPU-second | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for d, p in zip(r["decode"], r["prefill"]):
        lines.append(f"| {d['model']} | {d['type']} | {d['threads']} | {d['gbs']} | {d['of_read_bw']:.0%} | {d['ms']} "
                     f"({d['cpu_ms']}) | {d['load'][0]} | {p['gflops']} | {p['apply_gflops']} | "
                     f"{p['torch_f32_gflops']} | {' / '.join(map(str, p['gflop_per_cpu_s']))} | {p['load'][0]} |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main()
