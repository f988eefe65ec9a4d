"""Serving benchmark: N concurrent streaming clients against `wslm serve`, beside the offline engine.

Reports output tok/s, time to first token (p50/p99) and inter-token latency (p50/p99) over the server, then
runs LLM.generate on the same prompts with the same sampling to give the share of the offline throughput the
server keeps (target: >= 85% at 32 streams). Appends a dated markdown section, with the machine, to
docs/benchmarks-log.md.

    .venv/bin/python bench/serve.py                        # starts a server on the demo model, 32 streams
    .venv/bin/python bench/serve.py --url http://127.0.0.1:8000 --model demo   # a running server
    .venv/bin/python bench/serve.py --concurrency 8 --max-tokens 32 --no-record

Every request asks for exactly --max-tokens tokens (ignore_eos), so both sides generate the same amount."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TOPICS = ["the sea", "a mountain village", "the history of bread", "a robot learning to paint", "winter",
          "an old library", "the first day of school", "a lighthouse keeper", "city traffic", "a garden",
          "the moon landing", "a jazz band", "a rainy afternoon", "a chess match", "a long train journey",
          "a bakery at dawn"]


def make_prompts(n: int) -> list[str]:
    return [f"Write a short story about {TOPICS[i % len(TOPICS)]}. Story number {i + 1}:" for i in range(n)]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


# ---- the server side ---------------------------------------------------------------------------------
def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "wslm", "serve", "--model", args.model, "--port", "0",
           "--max-num-seqs", str(max(args.concurrency, 1)), "--uvicorn-log-level", "warning",
           *engine_flags(args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=sys.stderr, text=True, cwd=REPO)
    assert proc.stdout is not None
    for line in proc.stdout:
        event = json.loads(line)
        if event["event"] == "ready":
            return proc, event["url"]
        if event["event"] == "error":
            raise SystemExit(f"the server did not start: {event['message']}")
    raise SystemExit(f"the server exited ({proc.wait()}) before it was ready")


def engine_flags(args: argparse.Namespace) -> list[str]:
    flags = []
    if args.kv_cache_memory:
        flags += ["--kv-cache-memory", args.kv_cache_memory]
    if args.max_model_len:
        flags += ["--max-model-len", str(args.max_model_len)]
    return flags


async def one_stream(client, url: str, model: str, prompt: str, max_tokens: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    arrivals: list[float] = []
    tokens = 0
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode()[:300]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk["choices"] and chunk["choices"][0]["text"]:
                arrivals.append(time.perf_counter())
    # a server without stream_options' usage (llama-cpp-python's): one token a streamed text chunk
    return {"start": start, "arrivals": arrivals, "tokens": tokens or len(arrivals), "end": time.perf_counter()}


async def run_clients(url: str, model: str, prompts: list[str], concurrency: int, max_tokens: int) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        await one_stream(client, url, model, "Warm up.", 4)
        gate = asyncio.Semaphore(concurrency)

        async def limited(prompt: str) -> dict:
            async with gate:
                return await one_stream(client, url, model, prompt, max_tokens)

        t0 = time.perf_counter()
        results = await asyncio.gather(*[limited(p) for p in prompts])
        wall = time.perf_counter() - t0
    ttft = [r["arrivals"][0] - r["start"] for r in results if r["arrivals"]]
    itl = [b - a for r in results for a, b in zip(r["arrivals"], r["arrivals"][1:])]
    tokens = sum(r["tokens"] for r in results)
    return {"tokens": tokens, "wall": wall, "tok_s": tokens / wall, "ttft": ttft, "itl": itl}


# ---- the offline side --------------------------------------------------------------------------------
def load_offline(args: argparse.Namespace):
    from wslm.backend import LLM, SamplingParams
    from wslm.backend.entrypoints.openai.launcher import parse_model_len, parse_size

    kwargs = {"max_num_seqs": max(args.concurrency, 1)}
    if args.kv_cache_memory:
        kwargs["kv_cache_memory"] = parse_size(args.kv_cache_memory)
    if args.max_model_len:
        kwargs["max_model_len"] = parse_model_len(str(args.max_model_len))
    llm = LLM(args.model, **kwargs)
    warm = threading.Thread(target=llm.generate, args=(["Warm up."], SamplingParams(max_tokens=4)))
    warm.start()
    warm.join()
    return llm


def run_offline(llm, args: argparse.Namespace, prompts: list[str]) -> dict:
    """LLM.generate on a worker thread, as the server runs its engine: on an oversubscribed CPU, torch's
    OpenMP spin-waits make the main thread several times slower (seen: 8x on 2 shared cores), which would
    flatter the server; on a worker thread both sides run under the same conditions."""
    box: dict = {}
    worker = threading.Thread(target=lambda: box.update(_generate_all(llm, args, prompts)))
    worker.start()
    worker.join()
    return box


def _generate_all(llm, args: argparse.Namespace, prompts: list[str]) -> dict:
    from wslm.backend import SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
    # In waves of --concurrency, as the server sees them.
    t0 = time.perf_counter()
    tokens = 0
    for i in range(0, len(prompts), args.concurrency):
        for out in llm.generate(prompts[i:i + args.concurrency], params):
            tokens += sum(len(c.token_ids) for c in out.outputs)
    wall = time.perf_counter() - t0
    return {"tokens": tokens, "wall": wall, "tok_s": tokens / wall}


# ---- report ------------------------------------------------------------------------------------------
def machine() -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from machine import describe

    return describe()


def report(args: argparse.Namespace, served: dict, offline: dict | None, where: str) -> str:
    ms = 1000.0
    kept = served["tok_s"] / offline["tok_s"] * 100 if offline else None
    rows = [
        ("output tok/s, server", f"{served['tok_s']:.1f} ({served['tokens']} tokens in {served['wall']:.1f} s)"),
        ("output tok/s, offline LLM.generate",
         f"{offline['tok_s']:.1f} ({offline['tokens']} tokens in {offline['wall']:.1f} s)" if offline else "not run"),
        ("throughput kept", f"{kept:.0f}% (target >= 85%)" if kept is not None else "n/a"),
        ("TTFT p50 / p99", f"{percentile(served['ttft'], 0.5) * ms:.0f} ms / {percentile(served['ttft'], 0.99) * ms:.0f} ms"),
        ("inter-token latency p50 / p99",
         f"{percentile(served['itl'], 0.5) * ms:.1f} ms / {percentile(served['itl'], 0.99) * ms:.1f} ms"),
    ]
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [
        f"## {stamp} — server, {args.concurrency} concurrent streams (bench/serve.py)",
        "",
        f"Machine: {machine()}",
        "",
        f"Model `{args.model}`, {args.num_prompts} prompts, {args.max_tokens} output tokens each (ignore_eos, "
        f"greedy), streamed through /v1/completions by {args.concurrency} concurrent clients on the same "
        f"machine; server: {where}. Best of {args.rounds} alternating rounds (server/offline tok/s per round: "
        f"{args.round_log}).",
        "",
        "| metric | value |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in rows],
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server (default: start one)")
    ap.add_argument("--model", default="demo", help="model to start / served name to ask for")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--num-prompts", type=int, default=None, help="default: = concurrency")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--kv-cache-memory", default=None, help="passed to the server and the offline engine")
    ap.add_argument("--max-model-len", default=None)
    ap.add_argument("--rounds", type=int, default=3, help="alternating server/offline rounds; best of each")
    ap.add_argument("--no-offline", action="store_true", help="skip the LLM.generate comparison")
    ap.add_argument("--no-record", action="store_true", help="do not append to docs/benchmarks-log.md")
    args = ap.parse_args()
    args.num_prompts = args.num_prompts or args.concurrency
    prompts = make_prompts(args.num_prompts)

    # Both sides stay loaded and run in alternating rounds: on a shared machine the load drifts, and the
    # best round of each side is the least disturbed one. The idle side uses no CPU.
    llm = None if args.no_offline else load_offline(args)
    proc = None
    url = args.url
    if url is None:
        proc, url = start_server(args)
    served_rounds, offline_rounds = [], []
    try:
        for r in range(args.rounds):
            served_rounds.append(asyncio.run(
                run_clients(url.rstrip("/"), args.model, prompts, args.concurrency, args.max_tokens)))
            if llm is not None:
                offline_rounds.append(run_offline(llm, args, prompts))
            print(f"round {r + 1}: server {served_rounds[-1]['tok_s']:.1f} tok/s"
                  + (f", offline {offline_rounds[-1]['tok_s']:.1f} tok/s" if offline_rounds else ""),
                  file=sys.stderr)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    served = max(served_rounds, key=lambda x: x["tok_s"])
    offline = max(offline_rounds, key=lambda x: x["tok_s"]) if offline_rounds else None
    args.round_log = ", ".join(
        f"{s_['tok_s']:.0f}" + (f"/{o['tok_s']:.0f}" if o else "")
        for s_, o in zip(served_rounds, offline_rounds or [None] * len(served_rounds)))
    text = report(args, served, offline, "started by the script" if proc else url)
    print(text)
    if not args.no_record:
        path = REPO / "docs" / "benchmarks-log.md"
        if not path.exists():
            path.write_text("# Benchmarks\n\nNumbers from the scripts in `bench/`, newest last, with the machine "
                            "they ran on.\n\n")
        with path.open("a") as f:
            f.write("\n" + text)
        print(f"appended to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
