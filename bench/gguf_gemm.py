"""Micro-benchmark of the tiled block GEMM (wslm/kernels/cpu_gguf_gemm.c) against what prefill ran before it
on the same matrices, in the same process, interleaved: the block GEMV kernel (cpu_gguf.c, each row group
read from the file's blocks) and the dequantized slices + torch's float32 GEMM (gguf_blocks._prefill).

Shapes: one Llama-3.2-3B decoder layer's matrices (q|k|v 5120x3072, o 3072x3072, gate|up 16384x3072, down
3072x8192) as random block bytes, float32 activations of --rows rows. Each figure is the best of --repeat
rounds of CPU time of the calling thread at --threads 1 (wall time at more threads), so that other work on a
shared machine moves it less; the load average is printed beside it.

    python bench/gguf_gemm.py [--types Q4_K,Q6_K,Q4_0] [--rows 16,64,512] [--threads 1] [--repeat 3]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from kernel_testing import random_gguf_blocks  # noqa: E402

from wslm.backend.quant.gguf_blocks import TYPE_IDS, GGUFBlockWeight  # noqa: E402
from wslm.kernels import cpu_gguf, cpu_gguf_gemm  # noqa: E402

SHAPES = {"qkv": (5120, 3072), "o": (3072, 3072), "gate_up": (16384, 3072), "down": (3072, 8192)}


def _gemv(w: GGUFBlockWeight, x: torch.Tensor, threads: int) -> torch.Tensor:
    out = torch.empty(x.shape[0], w.out_features)
    cpu_gguf.library().wslm_gguf_mm(ctypes.addressof(w.c_struct()), x.data_ptr(), x.shape[0], 0, out.data_ptr(), 0,
                                    threads)  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--types", default="Q4_K,Q6_K,Q4_0")
    p.add_argument("--rows", default="16,64,512")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    print(f"cpu_gguf_gemm native={cpu_gguf_gemm.native()} threads={args.threads} clock={clock.__name__}")
    for kind in args.types.split(","):
        for name in args.shapes.split(","):
            n, k = SHAPES[name]
            w = GGUFBlockWeight([(TYPE_IDS[kind], random_gguf_blocks(n, k, kind).contiguous())], k)
            s = w.c_struct()
            for m in map(int, args.rows.split(",")):
                x = torch.randn(m, k)
                paths = {"gemv": lambda w=w, x=x: _gemv(w, x, args.threads), "dequant+sgemm": lambda w=w, x=x: w._prefill(x),
                         "tiled": lambda s=s, x=x: cpu_gguf_gemm.mm(x, s, threads=args.threads)}  # fmt: skip
                best = dict.fromkeys(paths, float("inf"))
                for _ in range(args.repeat):
                    for key, fn in paths.items():
                        t = clock()
                        fn()
                        best[key] = min(best[key], clock() - t)
                gf = 2 * m * n * k / 1e9
                cells = " ".join(f"{key} {v * 1e3:.1f} ms ({gf / v:.0f} GF/s)" for key, v in best.items())
                old = min(best["gemv"], best["dequant+sgemm"])
                print(f"{kind} {name} {n}x{k} M={m}: {cells}; tiled vs best old {old / best['tiled']:.2f}x "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
