"""Offline engine throughput on the demo model (or --model PATH) against HF transformers in the same run.

    .venv/bin/python bench/throughput.py [--model demo|PATH] [--requests 32] [--max-tokens 64] [--no-hf]

Chat requests with ignore_eos (every request makes exactly --max-tokens tokens). Reports output tok/s and
TTFT for wslm at batch 1 and at --requests concurrent requests, the per-step Python overhead (step time
outside the model forward), and HF's generate one request at a time and as one left-padded batch.
Appends the table to docs/benchmarks-log.md."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine  # noqa: E402

TOPICS = ["a robot", "the sea", "a lost key", "a mountain village", "a clockmaker", "the moon", "a red kite",
          "an old library"]  # fmt: skip


def chats(n: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"Write a short story about {TOPICS[i % len(TOPICS)]} (#{i})."}]
            for i in range(n)]  # fmt: skip


def run_wslm(llm, n: int, max_tokens: int) -> dict:
    from wslm.backend import SamplingParams

    engine = llm.llm_engine
    # engine.runner before the executor split: the same script measures a checkout from before it too.
    model = (engine.executor.runner if hasattr(engine, "executor") else engine.runner).model
    forward_time = [0.0]
    original = model.forward

    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            forward_time[0] += time.perf_counter() - t

    model.forward = timed
    try:
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        start = time.perf_counter()
        outs = llm.chat(chats(n), params)
        wall = time.perf_counter() - start
    finally:
        model.forward = original
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    ttfts = [o.metrics.first_token_time - o.metrics.arrival_time for o in outs]
    return {
        "tok_s": tokens / wall,
        "ttft_p50": statistics.median(ttfts),
        "ttft_max": max(ttfts),
        "overhead": (wall - forward_time[0]) / wall,
        "wall": wall,
    }


def run_hf(n_sequential: int, batch: int, max_tokens: int, model_name: str = "demo") -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if model_name == "demo":
        from wslm.demo import demo_model_path

        path = demo_model_path()
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()
    else:  # an HF folder (safetensors + tokenizer)
        tok = AutoTokenizer.from_pretrained(model_name)
        model = AutoModelForCausalLM.from_pretrained(model_name, dtype=torch.float32).eval()
    gen = dict(max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False, pad_token_id=tok.pad_token_id or 0)
    prompts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats(batch)]
    with torch.no_grad():
        enc = tok(prompts[0], return_tensors="pt", add_special_tokens=False)
        model.generate(**enc, **{**gen, "max_new_tokens": 2, "min_new_tokens": 2})  # warm-up
        start = time.perf_counter()
        for p in prompts[:n_sequential]:
            enc = tok(p, return_tensors="pt", add_special_tokens=False)
            model.generate(**enc, **gen)
        seq_tok_s = n_sequential * max_tokens / (time.perf_counter() - start)
        tok.padding_side = "left"
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        start = time.perf_counter()
        model.generate(**enc, **gen)
        batch_tok_s = batch * max_tokens / (time.perf_counter() - start)
    return {"sequential_tok_s": seq_tok_s, "batch_tok_s": batch_tok_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo", help="demo, or a model folder the engine supports")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--hf-sequential", type=int, default=3, help="HF requests run one at a time")
    ap.add_argument("--hf-batch", type=int, default=16)
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--dtype", default="auto", help="auto (also runs float32 when auto is not float32) or a dtype")
    ap.add_argument("--no-write", action="store_true", help="print only, leave docs/benchmarks-log.md alone")
    args = ap.parse_args()

    import torch

    from wslm.backend import LLM, SamplingParams
    try:
        from wslm.backend.loader.model_loader import resolve_dtype
    except ImportError:  # a checkout from before the backend's layer folders (before/after runs)
        from wslm.backend.model_loader import resolve_dtype

    auto = str(resolve_dtype("auto", None, torch.device("cpu"))).removeprefix("torch.")
    dtypes = [args.dtype] if args.dtype != "auto" else (["auto", "float32"] if auto != "float32" else ["auto"])
    rows = [
        "| run | output tok/s | TTFT p50 (s) | TTFT max (s) | step overhead |",
        "|---|---:|---:|---:|---:|",
    ]
    results = {}
    for dtype in dtypes:
        label = f"auto = {auto}" if dtype == "auto" else dtype
        llm = LLM(args.model, max_num_seqs=max(args.requests, 1), dtype=dtype)
        llm.generate("warm up", SamplingParams(max_tokens=4))
        single = run_wslm(llm, 1, 128)
        many = run_wslm(llm, args.requests, args.max_tokens)
        results[dtype] = (single, many)
        del llm
        rows += [
            f"| wslm ({label}), 1 stream, 128 tokens | {single['tok_s']:.1f} | {single['ttft_p50']:.3f} | "
            f"{single['ttft_max']:.3f} | {single['overhead']:.1%} |",
            f"| wslm ({label}), {args.requests} concurrent, {args.max_tokens} tokens each | {many['tok_s']:.1f} | "
            f"{many['ttft_p50']:.3f} | {many['ttft_max']:.3f} | {many['overhead']:.1%} |",
        ]
    single, many = results[dtypes[0]]
    if not args.no_hf:
        hf = run_hf(args.hf_sequential, args.hf_batch, args.max_tokens, args.model)
        rows += [
            f"| HF transformers generate, one at a time ({args.hf_sequential} requests) | "
            f"{hf['sequential_tok_s']:.1f} | | | |",
            f"| HF transformers generate, padded batch of {args.hf_batch} | {hf['batch_tok_s']:.1f} | | | |",
        ]
        for dtype, (_, m) in results.items():
            rows.append(f"\nwslm ({dtype}) at {args.requests} concurrent = {m['tok_s'] / hf['batch_tok_s']:.1f}x "
                        "HF's padded batch (target >= 3x). HF runs in float32, its default.")
    rows.append(
        f"Single stream {single['tok_s']:.1f} tok/s (target >= 20); step overhead at batch {args.requests} "
        f"{many['overhead']:.1%} (target < 10%). Overhead = step time outside the model forward "
        "(scheduling, input prep, sampling, detokenizing)."
    )
    table = "\n".join(rows)
    print(table)
    if not args.no_write:
        title = "Offline engine throughput (bench/throughput.py)"
        if args.model != "demo":
            title += f", model {Path(args.model).name}"
        print("written to", machine.append_section(title, table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
