"""A few chats decoding at once: the C rows step (platforms/cpu/decode_rows.py, up to 15 decode rows in one
call) against the batched eager step, in the same process, alternating.

    .venv/bin/python bench/batch_rows.py [--model demo|PATH.gguf] [--chats 4] [--max-tokens 24] [--rounds 2]

tok/s = every chat's decode tokens / (last token time - first first-token time); greedy; prefix caching off
(each chat its own prompt). The eager side is the same engine with the C rows step passing on every step."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--chats", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    from wslm.backend import LLM, SamplingParams
    from wslm.backend.platforms.cpu import decode_rows

    llm = LLM(os.path.expanduser(args.model), max_model_len=1024, kv_cache_memory=1 << 30,
              enable_prefix_caching=False, enforce_eager=True)  # fmt: skip
    real = decode_rows.run_rows
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    prompts = [{"prompt_token_ids": [(i * 7 + j * 13) % 900 + 5 for i in range(32)]} for j in range(args.chats)]
    rates: dict[str, list[float]] = {"C rows step": [], "eager": []}
    load = os.getloadavg()[0]
    for _ in range(args.rounds):
        for mode in rates:
            decode_rows.run_rows = real if mode == "C rows step" else (lambda *a, **k: None)
            outs = llm.generate(prompts, params, use_tqdm=False)
            n = sum(len(o.outputs[0].token_ids) - 1 for o in outs)
            span = max(o.metrics.finished_time for o in outs) - min(o.metrics.first_token_time for o in outs)
            rates[mode].append(n / span)
            print(mode, f"{n / span:.2f} tok/s", flush=True)
    decode_rows.run_rows = real
    print(f"`bench/batch_rows.py --model {args.model} --chats {args.chats} --max-tokens {args.max_tokens}`; load "
          f"average (1 min) at start / end: {load:.1f} / {os.getloadavg()[0]:.1f}")
    for mode, r in rates.items():
        print(f"- {mode}: " + " / ".join(f"{x:.1f}" for x in r) + " tok/s")
    print("Machine:", machine.describe())


if __name__ == "__main__":
    main()
