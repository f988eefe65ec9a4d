"""Structured output cost on the demo model: per-step time at batch 32 with half the requests under a
grammar vs none (same run, alternating rounds), the grammar share of the step, and the per-request
mask-fill cost of xgrammar against llguidance on the demo vocabulary (why the engine uses xgrammar).

    .venv/bin/python bench/structured.py [--batch 32] [--max-tokens 64] [--rounds 3] [--no-write]

Every request makes exactly --max-tokens tokens (min_tokens = max_tokens keeps EOS out for all, so the
grammars never end early). Decode steps only: the steps after every request has its first token."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine  # noqa: E402

REGEX = r"[A-Za-z0-9 ,.'\n-]+"
SCHEMA = {"type": "array", "items": {"type": "string", "maxLength": 40}, "minItems": 500}


def constraint(kind: str):
    from wslm.backend import StructuredOutputsParams

    if kind == "regex":
        return StructuredOutputsParams(regex=REGEX)
    return StructuredOutputsParams(json=SCHEMA)


def run(llm, batch: int, max_tokens: int, kind: str | None) -> dict:
    from wslm.backend import SamplingParams

    engine = llm.llm_engine
    executor = engine.executor
    # The grammar's share of a step: the executor fills the bitmask rows, the sampler applies them.
    hooks = [(executor.masker, "fill"), (executor.worker.sampler.grammar_masker, "apply_bitmask")]
    grammar_time = [0.0]

    def timed(original):
        def call(*args):
            t = time.perf_counter()
            try:
                return original(*args)
            finally:
                grammar_time[0] += time.perf_counter() - t

        return call

    for obj, name in hooks:
        setattr(obj, name, timed(getattr(obj, name)))
    try:
        for i in range(batch):
            spec = constraint(kind) if kind and i % 2 == 0 else None
            params = SamplingParams(temperature=0.7, seed=i, max_tokens=max_tokens, min_tokens=max_tokens,
                                    structured_outputs=spec)
            engine.add_request(f"b{i}", f"Write item {i} of a list of things to pack for a trip:", params)
        steps: list[float] = []
        cpu: list[float] = []
        started: set[str] = set()
        grammar_in_decode = 0.0
        while engine.has_unfinished_requests():
            before = grammar_time[0]
            t, c = time.perf_counter(), time.process_time()
            outs = engine.step()
            dt, dc = time.perf_counter() - t, time.process_time() - c
            if len(started) == batch:
                steps.append(dt)
                cpu.append(dc)
                grammar_in_decode += grammar_time[0] - before
            started.update(o.request_id for o in outs if o.outputs and o.outputs[0].token_ids)
    finally:
        for obj, name in hooks:
            delattr(obj, name)  # the instance attribute goes: the class's method is back
    return {"step_ms": 1000 * statistics.mean(steps), "cpu_ms": 1000 * statistics.mean(cpu),
            "grammar_ms": 1000 * grammar_in_decode / len(steps), "steps": len(steps)}


def fill_costs(tokenizer) -> dict:
    """Mean / max time to fill one request's next-token mask along a valid JSON reply."""
    text = json.dumps(["socks", "a toothbrush", "two books about the sea", "a warm coat"] * 3)
    ids = tokenizer.encode(text, add_special_tokens=False)
    schema = {"type": "array", "items": {"type": "string"}}
    vocab = len(tokenizer)
    out = {}
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_json_schema(json.dumps(schema)))
    mask = xgr.allocate_token_bitmask(1, vocab)
    times = []
    for tid in ids:
        t = time.perf_counter()
        matcher.fill_next_token_bitmask(mask, 0)
        times.append(time.perf_counter() - t)
        matcher.accept_token(tid)
    out["xgrammar"] = (statistics.mean(times), max(times))
    try:
        import llguidance
        import llguidance.hf
        import llguidance.torch
    except ImportError:
        return out
    lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)
    m = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_json_schema(schema))
    mask = llguidance.torch.allocate_token_bitmask(1, vocab)
    times = []
    for tid in ids:
        t = time.perf_counter()
        llguidance.torch.fill_next_token_bitmask(m, mask, 0)
        times.append(time.perf_counter() - t)
        m.consume_token(tid)
    out["llguidance"] = (statistics.mean(times), max(times))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-write", action="store_true", help="print only, leave docs/benchmarks-log.md alone")
    args = ap.parse_args()

    from wslm.backend import LLM

    llm = LLM("demo", max_num_seqs=args.batch, kv_cache_memory=512 << 20, max_model_len=1024)
    for kind in ("regex", "json"):  # compiled ahead, as the server does off the engine thread
        llm.llm_engine.structured.compile(constraint(kind))
    run(llm, 4, 8, "regex")  # warm-up
    results: dict[str, list[dict]] = {"none": [], "regex": [], "json": []}
    for _ in range(args.rounds):  # alternate, so that load from other processes hits every mode alike
        for kind in results:
            results[kind].append(run(llm, args.batch, args.max_tokens, None if kind == "none" else kind))
    med = {k: statistics.median(r["step_ms"] for r in v) for k, v in results.items()}
    cpu = {k: statistics.median(r["cpu_ms"] for r in v) for k, v in results.items()}
    gram = {k: statistics.median(r["grammar_ms"] for r in v) for k, v in results.items()}
    fills = fill_costs(llm.get_tokenizer())

    lines = [
        f"Batch {args.batch}, {args.max_tokens} tokens each, half the requests constrained (even ones), "
        f"dtype {llm.llm_engine.model_config.dtype}; median of {args.rounds} alternating rounds, decode steps "
        "only. The machine was shared with other agents' builds and tests while this ran: compare the rows "
        "with each other, not with other sections.",
        "",
        "CPU time (all threads of the process) is the steadier measure on a shared machine; wall time is shown "
        "too. The grammar column is the sampler's mask step alone (fill + apply), wall time.",
        "",
        "| requests | step wall (ms) | step CPU (ms) | grammar mask (ms/step) | overhead vs none, CPU | wall |",
        "|---|---|---|---|---|---|",
        f"| none constrained | {med['none']:.1f} | {cpu['none']:.1f} | {gram['none']:.2f} | — | — |",
    ]
    for kind, label in (("regex", "16 regex (free text)"), ("json", "16 JSON schema (array of strings)")):
        lines.append(f"| {label} | {med[kind]:.1f} | {cpu[kind]:.1f} | {gram[kind]:.2f} | "
                     f"{100 * (cpu[kind] / cpu['none'] - 1):+.1f}% | {100 * (med[kind] / med['none'] - 1):+.1f}% |")
    lines += ["", "Mask fill per request and step along a JSON reply, demo vocabulary (49,152 tokens):", ""]
    for lib, (mean, worst) in fills.items():
        lines.append(f"- {lib}: mean {1e6 * mean:.0f} us, worst {1e6 * worst:.0f} us")
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        print("written to", machine.append_section("structured output overhead (bench/structured.py)", body))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
