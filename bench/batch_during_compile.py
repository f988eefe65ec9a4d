"""Batch throughput while the CPU decode graph compiles in the background, against the eager engine.

    .venv/bin/python bench/batch_during_compile.py                   # dtype auto, 16 requests of 32 tokens
    .venv/bin/python bench/batch_during_compile.py --dtype float32 --requests 32

Two engines on the demo model, one after the other: `enforce_eager=True`, then the default (the batch graph
starts compiling at the first batch, decode_compiled.py). Each runs a warm-up batch and then --rounds timed
batches; on a 2-core machine the default engine's rounds fall inside its compile (1-2 minutes). Prints output
tok/s per round for both. The real-size issue's target: the compiling engine never below the eager one."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rounds(eager: bool, args) -> list[float]:
    from wslm.backend import LLM, SamplingParams
    from wslm.demo import demo_model_path

    llm = LLM(str(demo_model_path()), dtype=args.dtype, kv_cache_memory=256 << 20, enforce_eager=eager)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    prompts = [f"Write a short note about topic number {i}." for i in range(args.requests)]
    llm.generate(prompts[:2], params)  # warm-up; the default engine starts compiling its batch graph here
    out = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        outs = llm.generate(prompts, params)
        out.append(sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - start))
    runner = llm.llm_engine.core.executor.runner
    compiled = getattr(getattr(runner, "cpu_plan", None), "compiled", None)
    state = "no compile" if compiled is None else ("compiled" if compiled.compiled is not None else "compiling")
    print(f"{'eager' if eager else 'default'}: " + ", ".join(f"{v:.1f}" for v in out) + f" tok/s ({state} at end)",
          flush=True)  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs", flush=True)
    eager = rounds(True, args)
    default = rounds(False, args)
    print(f"default / eager, best rounds: {max(default) / max(eager):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
