"""One-row products (decode) of real GGUF matrices: the file's blocks in place (cpu_gguf.c) against the
repacked form the loader made before blocks were the default (int4 codes / int8 rows, cpu_gemv.c), in
one process, interleaved, the fastest single product of --repeat rounds (a shared machine's noise only ever adds time).

Each round multiplies --layers layers' copies of a matrix in turn (larger than the caches, as in decode),
the same layers for both forms. Prints ms per matrix, the ratio and GB/s of the blocks' bytes, with the
load average. --variant NAME=SOURCE[:CFLAGS] (repeatable) adds another build of a cpu_gguf.c (say, the
main branch's copy, or this one with -DGGUF_AHEAD=4) timed in the same rounds, for kernel work.

--model times whole passes instead: every linear weight of every layer and the LM head in decode order
(one token's weight traffic, without attention), blocks and repacked alternately, the best pass of each.

    python bench/gguf_blocks_vs_repacked.py [--file ~/.cache/wslm-bench/3b-Q4_K_M.gguf] [--threads 1,2]
    python bench/gguf_blocks_vs_repacked.py --model [--file ...]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np
import torch

from wslm.backend.quant.gguf_blocks import TYPE_IDS, GGUFBlockWeight
from wslm.backend.quant.linear import apply_linear, finalize
from wslm.kernels import cpu_gemv, cpu_gguf

MATRICES = ("attn_q", "attn_v", "ffn_gate", "ffn_down")


def load(path: Path, name: str, layers: int, with_repacked: bool = True) -> tuple[list, list, str]:
    reader = gguf.GGUFReader(str(path))
    by_name = {t.name: t for t in reader.tensors}
    blocks, kinds = [], set()
    for i in range(10_000):
        t = by_name.get(f"blk.{i}.{name}.weight")
        if t is None or len(blocks) == layers:
            break
        if t.tensor_type.name not in TYPE_IDS:
            continue
        if kinds and t.tensor_type.name not in kinds:
            continue  # one type per row of the table (Q4_K_M mixes Q4_K and Q6_K across layers)
        kinds.add(t.tensor_type.name)
        data = torch.from_numpy(np.array(t.data))
        blocks.append(GGUFBlockWeight([(TYPE_IDS[t.tensor_type.name], data)], int(t.shape[0]), name=t.name))
    repacked = [finalize(w.legacy(), torch.device("cpu"), torch.bfloat16) for w in blocks] if with_repacked else blocks
    return blocks, repacked, kinds.pop()


def model_pass(path: Path, threads: list[int], repeat: int) -> None:
    import warnings

    reader = gguf.GGUFReader(str(path))
    order = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    by_name = {t.name: t for t in reader.tensors}
    names = [f"blk.{i}.{m}.weight" for i in range(10_000) if f"blk.{i}.attn_q.weight" in by_name for m in order]
    names.append("output.weight" if "output.weight" in by_name else "token_embd.weight")
    blocks = []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for n in names:
            t = by_name[n]
            data = torch.from_numpy(t.data)  # the mapped file's pages, as the loader keeps them
            blocks.append(GGUFBlockWeight([(TYPE_IDS[t.tensor_type.name], data)], int(t.shape[0]), name=n))
    repacked = [finalize(w.legacy(), torch.device("cpu"), torch.bfloat16) for w in blocks]
    print(f"{path.name}: {len(blocks)} matrices, blocks {sum(w.nbytes for w in blocks) / 1e9:.2f} GB", flush=True)
    xs = {k: torch.randn(1, k).to(torch.bfloat16) for k in {w.in_features for w in blocks}}

    def one(ws: list) -> float:
        start = time.perf_counter()
        for bw, w in zip(blocks, ws):
            apply_linear(xs[bw.in_features], w)
        return time.perf_counter() - start

    for n in threads:
        torch.set_num_threads(n)
        one(blocks), one(repacked)
        b = r = float("inf")
        for _ in range(repeat):
            b, r = min(b, one(blocks)), min(r, one(repacked))
        print(f"whole pass t{n}: blocks {b * 1e3:7.2f} ms  repacked {r * 1e3:7.2f} ms  blocks/repacked time "
              f"{b / r:5.3f}  load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip


def timed(ws: list, xs: torch.Tensor) -> float:
    """The fastest single product of a round over the layers (each matrix cold: the others came between)."""
    top = float("inf")
    for w in ws:
        start = time.perf_counter()
        apply_linear(xs, w)
        top = min(top, time.perf_counter() - start)
    return top


def build_variant(spec: str) -> tuple[str, ctypes.CDLL]:
    """NAME=SOURCE[:CFLAGS] -> (NAME, the library of that cpu_gguf.c alone)"""
    name, rest = spec.split("=", 1)
    source, _, flags = rest.partition(":")
    out = tempfile.NamedTemporaryFile(suffix=".so", delete=False).name
    include = Path(cpu_gemv.__file__).parent
    cmd = [cpu_gemv.compiler(), *cpu_gemv._FLAGS, "-fopenmp", f"-I{include}", *flags.split(), source, "-o", out, "-lm"]
    subprocess.run(cmd, check=True)
    lib = ctypes.CDLL(out)
    lib.wslm_gguf_mm.argtypes = cpu_gguf.library().wslm_gguf_mm.argtypes
    return name, lib


def timed_lib(lib: ctypes.CDLL, structs: list, x: torch.Tensor, out: torch.Tensor, threads: int) -> float:
    top = float("inf")
    for s in structs:
        start = time.perf_counter()
        lib.wslm_gguf_mm(ctypes.addressof(s), x.data_ptr(), 1, 1, out.data_ptr(), 1, threads)
        top = min(top, time.perf_counter() - start)
    return top


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", default=str(Path.home() / ".cache/wslm-bench/3b-Q4_K_M.gguf"))
    ap.add_argument("--matrices", default=",".join(MATRICES))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--blocks-only", action="store_true", help="time the blocks alone (kernel experiments)")
    ap.add_argument("--model", action="store_true", help="whole passes over every layer's weights and the head")
    ap.add_argument("--variant", action="append", default=[], help="NAME=SOURCE[:CFLAGS], another cpu_gguf.c")
    args = ap.parse_args()
    print(f"{Path(args.file).name}, load {os.getloadavg()[0]:.2f}")
    if args.model:
        model_pass(Path(args.file), [int(t) for t in args.threads.split(",")], args.repeat)
        return
    variants = [build_variant(v) for v in args.variant]
    for name in args.matrices.split(","):
        blocks, repacked, kind = load(Path(args.file), name, args.layers, not args.blocks_only)
        n, k = blocks[0].shape
        x = torch.randn(1, k).to(torch.bfloat16)
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            structs = [w.c_struct() for w in blocks]
            out = torch.empty(1, n, dtype=torch.bfloat16)
            ref = apply_linear(x, blocks[0])
            for vname, lib in variants:
                timed_lib(lib, structs[:1], x, out, threads)
                if not torch.equal(out, ref):
                    print(f"  variant {vname}: output differs from the blocks' by up to "
                          f"{(out.float() - ref.float()).abs().max().item():.3g}")  # fmt: skip
            timed(blocks, x), timed(repacked, x)
            b = r = float("inf")
            v = [float("inf")] * len(variants)
            for _ in range(args.repeat):
                b = min(b, timed(blocks, x))
                r = min(r, timed(repacked, x))
                for i, (_, lib) in enumerate(variants):
                    v[i] = min(v[i], timed_lib(lib, structs, x, out, threads))
            gbs = blocks[0].nbytes / b / 1e9
            extra = "".join(f"  {vn} {t * 1e3:7.3f} ms ({t / r:4.2f})" for (vn, _), t in zip(variants, v))
            print(f"{name:9s} {kind:5s} {n:5d}x{k:<5d} t{threads}: blocks {b * 1e3:7.3f} ms ({gbs:5.1f} GB/s)  "
                  f"repacked {r * 1e3:7.3f} ms  blocks/repacked time {b / r:5.2f}{extra}  load {os.getloadavg()[0]:.2f}",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
