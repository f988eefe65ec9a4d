"""Tensor parallelism: throughput and per-step overhead of TP=N against TP=1 in the same run.

    .venv/bin/python bench/tp.py [--model demo] [--sizes 1,3] [--requests 32] [--max-tokens 32]

On CPU the point is correctness and the cost of the machinery (N processes share the same cores, so TP is
not faster there): it reports output tok/s at batch 1 and at --requests, the round trip of one call to every
worker (the per-step floor the executor adds), the time rank 0 spends in all-reduce/all-gather per step,
and whether the greedy tokens match TP=1. With GPUs (one per rank: --sizes 1,2,4) the same run measures
the scaling from 1 to N GPUs.
The demo model has 9 heads and 3 KV heads: its sizes are 1 and 3. Appends a table to docs/benchmarks.md."""

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


def measure(model: str, size: int, requests: int, max_tokens: int, dtype: str) -> dict:
    from wslm.backend import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(model, tensor_parallel_size=size, dtype=dtype, kv_cache_memory=512 << 20, max_model_len=1024)
    load_s = time.perf_counter() - start
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    llm.generate(prompts(2), SamplingParams(max_tokens=4))  # warm-up
    row: dict = {"size": size, "load_s": load_s}
    for label, n in (("single", 1), ("batch", requests)):
        t = time.perf_counter()
        outs = llm.generate(prompts(n), params)
        dt = time.perf_counter() - t
        row[label] = sum(len(o.outputs[0].token_ids) for o in outs) / dt
        if label == "single":
            row["tokens"] = outs[0].outputs[0].token_ids
    runner = llm.llm_engine.runner
    if size > 1:  # collectives' share of a decode-heavy run, timed inside the workers
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo")
    ap.add_argument("--sizes", default="1,3")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--note", default="", help="a line added under the table (e.g. 'machine shared')")
    args = ap.parse_args()
    rows = [measure(args.model, int(s), args.requests, args.max_tokens, args.dtype) for s in args.sizes.split(",")]
    base = rows[0]
    lines = [
        f"Model `{args.model}` ({args.dtype}), greedy, {args.max_tokens} tokens per request, "
        "mp executor (one process per rank, gloo on CPU).",
        "",
        "| TP size | load (s) | 1 stream tok/s | ratio | "
        f"{args.requests} concurrent tok/s | ratio | worker round trip | collectives per step | tokens = TP1 |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ping = f"{r['ping_us']:.0f} µs" if "ping_us" in r else "—"
        comm = (f"{r['comm_ms_per_step']:.1f} ms ({r['comm_share']:.0%} of the run)"
                if "comm_ms_per_step" in r else "—")
        lines.append(
            f"| {r['size']} | {r['load_s']:.1f} | {r['single']:.1f} | {r['single'] / base['single']:.2f}x | "
            f"{r['batch']:.1f} | {r['batch'] / base['batch']:.2f}x | {ping} | {comm} | {r['tokens'] == base['tokens']} |"
        )
    if args.note:
        lines += ["", args.note]
    body = "\n".join(lines)
    print(body)
    machine.append_section("tensor parallel (bench/tp.py)", body)


if __name__ == "__main__":
    main()
