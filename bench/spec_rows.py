"""The cost of a verification step on CPU: the multi-row C step (platforms/cpu/decode_rows.py) for M rows of
one sequence against one one-row C step, in CPU time (this process, all threads), on the same KV pool.

    .venv/bin/python bench/spec_rows.py [--model demo|PATH.gguf] [--reps 20] [--context 200]

A step of M rows yields between 1 and M tokens (the accepted drafts and one more), so speculation pays where
tokens per step exceed this ratio. Speculation's tokens per step depend on the text; this ratio on the weights
and the machine only, so it is the figure for a model whose proposals are never accepted here (the
random-weight 3B-shaped bench file does not copy its prompt). Prints a table with the load average."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--context", type=int, default=200, help="tokens in the sequence before the rows")
    ap.add_argument("--rows", default="1,2,3,4,5,6")
    ap.add_argument("--threads", type=int, default=1,
                    help="threads of both steps (2: the team a lone chat's step runs on an idle 2-core machine)")
    args = ap.parse_args()
    os.environ.setdefault("WSLM_GGUF_DEQUANTIZE", "0")
    import torch

    from wslm.backend import LLM, SamplingParams
    from wslm.backend.modeling.layers.attention import AttentionMetadata
    from wslm.backend.platforms.cpu.decode_rows import run_rows

    llm = LLM(os.path.expanduser(args.model), kv_cache_memory=256 << 20, max_model_len=args.context + 64,
              enforce_eager=True, enable_prefix_caching=False)  # fmt: skip
    runner = llm.llm_engine.executor.runner
    native = runner.native
    if native is None:
        sys.exit("this model does not take the C decode step here")
    native.fixed_threads = args.threads  # the same for both: 1 gives the ratio of work, more how a team spreads it
    tables = []
    tensorize = runner.tensorize

    def spy(step):
        tables.append((list(step.block_tables[0]), step.positions[-1]))
        return tensorize(step)

    runner.tensorize = spy
    llm.generate([{"prompt_token_ids": [(i * 7) % 900 + 5 for i in range(args.context)]}],
                 SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    runner.tensorize = tensorize
    table, last = tables[-1]
    bs = runner.block_size

    def inputs(positions):
        m = len(positions)
        meta = AttentionMetadata(
            slot_mapping=torch.tensor([table[p // bs] * bs + p % bs for p in positions], dtype=torch.int64),
            block_tables=torch.tensor([table] * m, dtype=torch.int32),
            cu_seqlens_q=torch.arange(m + 1, dtype=torch.int32),
            seq_lens=torch.tensor([p + 1 for p in positions], dtype=torch.int32),
            logits_indices=torch.arange(m, dtype=torch.int64), max_seqlen_q=1, max_seqlen_k=positions[-1] + 1,
        )  # fmt: skip
        return torch.tensor([5 + p for p in positions]), torch.tensor(positions), meta

    def cpu_wall_ms(fn) -> tuple[float, float]:
        fn()
        best, best_wall = float("inf"), float("inf")
        for _ in range(3):  # the least of three runs of reps: other processes' interference only adds
            c, w = time.process_time(), time.perf_counter()
            for _ in range(args.reps):
                fn()
            best = min(best, (time.process_time() - c) / args.reps * 1e3)
            best_wall = min(best_wall, (time.perf_counter() - w) / args.reps * 1e3)
        return best, best_wall

    load = os.getloadavg()[0]
    rows, one, one_wall = [], None, None
    for m in (int(r) for r in args.rows.split(",")):
        inp = inputs(list(range(last - m + 1, last + 1)))
        if m == 1:
            ms, wall = cpu_wall_ms(lambda inp=inp: native.run(*inp, threads=args.threads))
        else:
            ms, wall = cpu_wall_ms(lambda inp=inp: run_rows(native, *inp))
        one, one_wall = one or ms, one_wall or wall
        rows.append(f"| {m} | {ms:.2f} | {ms / one:.2f}x | {(ms / one - 1) / max(m - 1, 1):.2f} | {wall:.2f} | "
                    f"{wall / one_wall:.2f}x | {(wall / one_wall - 1) / max(m - 1, 1):.2f} |")
        print(rows[-1], flush=True)
    body = (f"`bench/spec_rows.py --model {args.model} --reps {args.reps} --context {args.context} --threads "
            f"{args.threads}`; load average (1 min) at start / end: {load:.1f} / {os.getloadavg()[0]:.1f}\n\n"
            "| rows | CPU ms a step | against one row | each extra row | wall ms a step | against one row | "
            "each extra row |\n|---:|---:|---:|---:|---:|---:|---:|\n" + "\n".join(rows))
    print(body)
    print("Machine:", machine.describe())


if __name__ == "__main__":
    main()
