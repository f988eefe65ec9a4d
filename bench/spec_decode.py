"""Speculative decoding (n-gram prompt lookup): single-stream decode tok/s with and without it, on prompts
whose answer repeats the prompt (edit this code, quote this document) and on one with no repeats.

    .venv/bin/python bench/spec_decode.py [--model demo|PATH.gguf] [--k 4] [--max-tokens 128] [--repeats 2]
    .venv/bin/python bench/spec_decode.py --model ~/.cache/wslm-bench/3b-Q4_K_M.gguf --max-tokens 64
    .venv/bin/python bench/spec_decode.py --model ~/.cache/wslm-bench/3b-Q4_K_M.gguf --oracle  (every proposal
        accepted: a random-weight model copies nothing, so this is how its verification steps pay at best)

One engine per model with speculation configured; the runs without it switch the engine's proposer off (the
same weights, KV pool and threads), alternating with and without so that a change of machine load hits both.
decode tok/s = (tokens - 1) / (last token time - first token time), from the request's own metrics; greedy;
the best of --repeats. CPU ms / token: this process's CPU time (all threads) for the chat less that of a
max_tokens=1 run of it, per decode token; the least of --repeats. On a shared machine wall time swings with
the neighbours' load, CPU time much less: it is the figure to compare there. Prints a table (load average included) and, with --log, appends it to
docs/benchmarks-log.md with JSON records in bench/results/."""

from __future__ import annotations

import argparse
import os
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine  # noqa: E402

CODE = '''def parse_rows(lines):
    rows = []
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, value = line.split("=", 1)
        rows.append((name.strip(), int(value)))
    return rows


def total(rows):
    return sum(value for _, value in rows)
'''
DOC = ("The lighthouse at Point Reyes was built in 1870 and stands on a rocky headland three hundred feet above the "
       "Pacific. Its first-order Fresnel lens, made in France, has 24 panels of glass prisms that focus the light of a "
       "single lamp into beams visible 24 nautical miles out to sea. The keepers climbed 308 steps every evening to "
       "wind the clockwork that turned the lens. Fog is frequent here: the headland is one of the foggiest places on "
       "the west coast of North America, and a steam foghorn was added in 1871.")
PROMPTS = {
    "edit code": [{"role": "user", "content": "Rename the function parse_rows to read_rows in this code and give "
                                              "back the whole file, unchanged otherwise:\n\n" + CODE}],
    "quote document": [{"role": "user", "content": "Here is a document:\n\n" + DOC + "\n\nQuote the document "
                                                   "above word for word."}],
    "no repeats": [{"role": "user", "content": "Write a short poem about a cat who wants to fly."}],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--lookup-max", type=int, default=4)
    ap.add_argument("--lookup-min", type=int, default=None, help="default: --lookup-max (vLLM's rule)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--wait-compile", type=float, default=0.0, metavar="S",
                    help="first wait up to S seconds for the compiled CPU decode step (verification rows use it)")
    ap.add_argument("--batch", type=int, default=1,
                    help="N copies of each chat at once (a batch: its rows verify through the batched step); "
                         "tok/s then counts every stream's tokens")
    ap.add_argument("--oracle", action="store_true",
                    help="propose the next K tokens of the output without speculation (every proposal accepted): "
                         "the ceiling of the verification step on a model whose output copies nothing (random weights)")
    ap.add_argument("--log", action="store_true", help="append to docs/benchmarks-log.md and bench/results/")
    args = ap.parse_args()
    from wslm.backend import LLM, SamplingParams

    spec = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": args.lookup_max,
            "prompt_lookup_min": args.lookup_min or args.lookup_max}
    # No prefix cache: a rerun's prompt would be a shorter prefill, rounded otherwise, and "same tokens" would
    # compare two prompts' KV rather than decoding with and without speculation.
    llm = LLM(os.path.expanduser(args.model), speculative_config=spec, max_model_len=2048, kv_cache_memory=512 << 20,
              enable_prefix_caching=False)  # fmt: skip
    core = llm.llm_engine.core
    speculator = core.speculator
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    plan = core.executor.runner.cpu_plan
    compiled = "no CPU plan"
    if plan is not None:
        compiled = "not built"
        if plan.compiled is not None:
            if args.wait_compile:
                plan.compiled.start()
                plan.compiled.wait(args.wait_compile)
            compiled = "ready" if plan.compiled.ready.is_set() else "not ready"

    first = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)

    def cpu() -> float:  # this process's CPU seconds, every thread (the engine runs in it)
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def run(messages, on: bool) -> tuple[float, float, tuple[int, int], list[int]]:
        """(decode tok/s, CPU ms per decode token, (accepted, proposed), tokens). The CPU time of the
        prompt and first token (a max_tokens=1 run of the same chat just before) is taken off."""
        core.speculator = speculator if on else None
        chats = [messages] * args.batch
        c0 = cpu()
        llm.chat(chats, first, use_tqdm=False)
        c1 = cpu()
        before = speculator.stats()
        outs = llm.chat(chats, params, use_tqdm=False)
        c2 = cpu()
        n = sum(len(o.outputs[0].token_ids) - 1 for o in outs)  # decode tokens (after each stream's first)
        span = max(o.metrics.finished_time for o in outs) - min(o.metrics.first_token_time for o in outs)
        after = speculator.stats()
        accepted = (after["spec_decode_num_accepted_tokens"] - before["spec_decode_num_accepted_tokens"],
                    after["spec_decode_num_draft_tokens"] - before["spec_decode_num_draft_tokens"])
        cpu_ms = 1000 * ((c2 - c1) - (c1 - c0)) / n
        return n / span, cpu_ms, accepted, outs[0].outputs[0].token_ids

    if args.oracle:  # the n-gram proposer replaced, in this process only, by the known continuation
        import wslm.backend.spec_decode.engine_hook as hook

        known: list[list[int]] = []

        def propose(token_ids, k, _lo, _hi):
            for ref in known:
                if ref[: len(token_ids)] == token_ids:
                    return ref[len(token_ids) : len(token_ids) + k]
            return []

        hook.propose_ngram = propose
        for messages in PROMPTS.values():
            core.speculator = None
            out = llm.chat(messages, params, use_tqdm=False)[0]
            known.append(list(out.prompt_token_ids) + list(out.outputs[0].token_ids))
    run(PROMPTS["no repeats"], False)  # warm-up: kernels, thread counts
    run(PROMPTS["no repeats"], True)
    rows, records = [], []
    load_start = os.getloadavg()[0]
    for name, messages in PROMPTS.items():
        best = {True: 0.0, False: 0.0}
        least = {True: float("inf"), False: float("inf")}
        accepted, same, ref = (0, 0), True, []
        for _ in range(args.repeats):
            for on in (False, True):
                rate, cpu_ms, acc, tokens = run(messages, on)
                best[on] = max(best[on], rate)
                least[on] = min(least[on], cpu_ms)
                if on:
                    accepted = acc
                    same = same and tokens == ref
                else:
                    ref = tokens
        speedup = best[True] / best[False]
        cpu_speedup = least[False] / least[True]
        rows.append(f"| {name} | {best[False]:.1f} | {best[True]:.1f} | {speedup:.2f}x | {least[False]:.1f} | "
                    f"{least[True]:.1f} | {cpu_speedup:.2f}x | {accepted[0]} of {accepted[1]} | "
                    f"{'yes' if same else 'no'} |")
        what = "speculation speed-up, every proposal accepted" if args.oracle else "ngram speculation speed-up"
        if args.batch > 1:
            what += f", {args.batch} streams"
        records.append({"metric": f"{what}, {name}", "model": Path(args.model).name,
                        "threads": os.cpu_count(), "engine": "wslm", "value": round(speedup, 3), "unit": "x",
                        "higher_is_better": True, "off_tok_s": best[False], "on_tok_s": best[True],
                        "off_cpu_ms_per_token": round(least[False], 2), "on_cpu_ms_per_token": round(least[True], 2),
                        "cpu_speedup": round(cpu_speedup, 3)})
    load = f"{load_start:.1f} / {os.getloadavg()[0]:.1f}"
    body = (f"`bench/spec_decode.py --model {args.model} --k {args.k} --lookup-max {args.lookup_max} --lookup-min "
            f"{args.lookup_min or args.lookup_max} --max-tokens {args.max_tokens}{' --oracle' if args.oracle else ''}{f' --batch {args.batch}' if args.batch > 1 else ''}`; "
            f"load average (1 min) at start / end: {load}; compiled CPU decode step at start: {compiled}\n\n"
            "| prompt | decode tok/s, no speculation | with ngram | speed-up | CPU ms / token, no speculation | "
            "with ngram | CPU speed-up | proposed tokens accepted | same tokens |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---|\n" + "\n".join(rows))
    print(body)
    print("Machine:", machine.describe())
    if args.log:
        machine.append_section("speculative decoding (n-gram)", body, records, "spec_decode")


if __name__ == "__main__":
    main()
