"""Tensor parallelism: throughput and per-step overhead of TP=N against TP=1 in the same run.

    .venv/bin/python bench/tp.py [--model demo] [--sizes 1,3] [--requests 32] [--max-tokens 32]
    .venv/bin/python bench/tp.py --model Qwen/Qwen2.5-7B-Instruct --device cuda   # GPUs: sizes 1..N

CPU (gloo): the point is correctness and the cost of the machinery (N processes share the same cores, so
TP is not faster there). CUDA (NCCL, one GPU per rank): the scaling from 1 to N GPUs; --sizes defaults to
1, 2, 4, 8 up to the visible GPUs, the dtype to bfloat16.

Per size it reports output tok/s at batch 1 and at --requests (and the ratio to TP=1: the scaling), the
weight bytes each rank holds, the round trip of one call to every worker (the per-step floor the executor
adds), the time rank 0 spends in all-reduce/all-gather per decode step inside the engine, the bare
all-reduce of one decode step's activations outside it (2 per layer, what the interconnect costs at
best), and whether the greedy tokens match TP=1 (dense float32 weights: they must; quantized ones, such as
the demo GGUF's, hold the same codes and scales on the ranks, but their kernels round each rank's partial
sum to bf16, so a near-tie can go the other way). The demo model has 9 heads and 3 KV heads: its sizes
are 1 and 3. Appends a table to docs/benchmarks-log.md."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine  # noqa: E402


def prompts(n: int) -> list[str]:
    return [f"Write a short story about a clockmaker and a lost key (#{i})." for i in range(n)]


def measure(model: str, size: int, requests: int, max_tokens: int, dtype: str, device: str) -> dict:
    from wslm.backend import LLM, SamplingParams
    from wslm.backend.modeling.weight_bytes import weight_bytes

    start = time.perf_counter()
    llm = LLM(model, tensor_parallel_size=size, dtype=dtype, device=device, kv_cache_memory=512 << 20,
              max_model_len=1024)  # fmt: skip
    load_s = time.perf_counter() - start
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    llm.generate(prompts(2), SamplingParams(max_tokens=4))  # warm-up
    mc = llm.llm_engine.model_config
    row: dict = {"size": size, "load_s": load_s, "mc": mc}
    for label, n in (("single", 1), ("batch", requests)):
        t = time.perf_counter()
        outs = llm.generate(prompts(n), params)
        dt = time.perf_counter() - t
        row[label] = sum(len(o.outputs[0].token_ids) for o in outs) / dt
        if label == "single":
            row["tokens"] = outs[0].outputs[0].token_ids
    runner = llm.llm_engine.executor.runner
    if size == 1:
        row["weights"] = sum(weight_bytes(runner.model).values())
    else:
        row["weights"] = max(sum(b.values()) for b in runner._call_all("weight_bytes"))
        # Collectives' share of a decode-heavy run, timed inside the workers (synchronizing on CUDA).
        runner._call_all("comm_profile", True)
        t = time.perf_counter()
        outs = llm.generate(prompts(requests), params)
        wall = time.perf_counter() - t
        comm_s, calls = runner._call_all("comm_profile", False)[0]
        steps = max(len(o.outputs[0].token_ids) for o in outs)
        row["comm_ms_per_step"] = comm_s / steps * 1e3
        row["comm_share"] = comm_s / wall

        pings = []
        for _ in range(200):
            t = time.perf_counter()
            runner._call_all("ping")
            pings.append(time.perf_counter() - t)
        row["ping_us"] = statistics.median(pings) * 1e6
    llm.llm_engine.shutdown()
    return row


# ---- the bare all-reduce, outside the engine ---------------------------------------------------------


def _allreduce_rank(rank: int, size: int, port: int, shape: tuple[int, int], dtype: str, device: str, out) -> None:
    import torch
    import torch.distributed as dist

    on_cuda = device == "cuda"
    if on_cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if on_cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size)  # fmt: skip
    x = torch.ones(shape, dtype=getattr(torch, dtype), device=f"cuda:{rank}" if on_cuda else "cpu")
    for _ in range(20):
        dist.all_reduce(x)
    calls = 200
    if on_cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(x)
    if on_cuda:
        torch.cuda.synchronize()
    if rank == 0:
        out.put((time.perf_counter() - t) / calls)
    dist.destroy_process_group()


def allreduce_us(size: int, shape: tuple[int, int], dtype: str, device: str) -> float:
    """Mean time of one all-reduce of a [tokens, hidden] tensor over `size` ranks, in µs."""
    import torch.multiprocessing as mp

    from wslm.backend.distributed.net import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_allreduce_rank, args=(r, size, port, shape, dtype, device, out)) for r in range(size)]
    for p in procs:
        p.start()
    seconds = out.get(timeout=300)
    for p in procs:
        p.join(timeout=60)
    return seconds * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--sizes", default=None, help="comma-separated; CPU default 1,3, CUDA 1,2,4,8 up to the GPUs")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--dtype", default=None, help="CPU default float32, CUDA bfloat16")
    ap.add_argument("--note", default="", help="a line added under the table (e.g. 'machine shared')")
    args = ap.parse_args()

    import torch

    from wslm.backend.distributed.parallel_state import check_divisible
    from wslm.backend.loader.model_source import resolve_model
    from wslm.backend.quant.shard import checkpoint_group_size

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    dtype = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    sizes = [int(s) for s in (args.sizes or ("1,2,4,8" if device == "cuda" else "1,3")).split(",")]
    if device == "cuda":
        sizes = [s for s in sizes if s <= gpus]
    rows = [measure(args.model, 1, args.requests, args.max_tokens, dtype, device)]
    mc = rows[0]["mc"]
    for s in sizes:
        if s == 1:
            continue
        try:  # the engine's own start-up rule (heads, MLP and expert widths, 4-bit groups)
            check_divisible(mc, s, checkpoint_group_size(resolve_model(args.model), mc.quantization))
        except ValueError as exc:
            print(f"skipping size {s}: {exc}")
            continue
        row = measure(args.model, s, args.requests, args.max_tokens, dtype, device)
        # Two all-reduces per layer (o and down), each of one decode step's [batch, hidden] activations.
        one = allreduce_us(s, (args.requests, mc.hidden_size), dtype, device)
        row["bare_ms_per_step"] = 2 * mc.num_layers * one / 1e3
        row["bare_us"] = one
        rows.append(row)
    base = rows[0]
    transport = (f"NCCL, one GPU per rank ({gpus} × {torch.cuda.get_device_name(0)})" if device == "cuda"
                 else "gloo on CPU, the ranks sharing the cores")  # fmt: skip
    lines = [
        f"Model `{args.model}` ({dtype}, {device}), greedy, {args.max_tokens} tokens per request, "
        f"mp executor (one process per rank), {transport}.",
        "",
        "| TP size | load (s) | weights per rank | 1 stream tok/s | ratio | "
        f"{args.requests} concurrent tok/s | ratio (scaling) | worker round trip | collectives per step "
        "(in engine) | bare all-reduce per step | tokens = TP1 |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ping = f"{r['ping_us']:.0f} µs" if "ping_us" in r else "—"
        comm = (f"{r['comm_ms_per_step']:.2f} ms ({r['comm_share']:.0%} of the run)"
                if "comm_ms_per_step" in r else "—")  # fmt: skip
        bare = (f"{r['bare_ms_per_step']:.2f} ms ({r['bare_us']:.0f} µs × {2 * mc.num_layers})"
                if "bare_us" in r else "—")  # fmt: skip
        lines.append(
            f"| {r['size']} | {r['load_s']:.1f} | {r['weights'] / 2**20:.0f} MiB | {r['single']:.1f} | "
            f"{r['single'] / base['single']:.2f}x | {r['batch']:.1f} | {r['batch'] / base['batch']:.2f}x | {ping} | "
            f"{comm} | {bare} | {r['tokens'] == base['tokens']} |"
        )
    if args.note:
        lines += ["", args.note]
    body = "\n".join(lines)
    print(body)
    machine.append_section(f"tensor parallel, {device} (bench/tp.py)", body)


if __name__ == "__main__":
    main()
