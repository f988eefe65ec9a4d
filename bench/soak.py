"""Soak test of `wslm serve` (a benchmark, not a test): many concurrent chat streams for a fixed time, with mixed
prompt lengths, multi-turn conversations (prefix reuse), clients that disconnect mid-stream or give up early,
and one wide fan-out request (n=64) a third of the way in. Loopback only, bounded in time.

Reports: requests served, errors (want 0), KV blocks still held once everything ended (want 0), the server's
RSS at start and end (want flat), and p50/p99 inter-token latency of the streams before, during and after
the fan-out (the scheduler's fairness: the ratio during/before is the figure to watch).

    python bench/soak.py                 # 10 minutes, 64 streams, the demo model
    python bench/soak.py --minutes 3 --no-record
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from machine import append_section  # noqa: E402

FILLER = ("The river runs past the old mill, where the miller keeps his records of every harvest since the "
          "flood. ")
QUESTIONS = ["Name three colours.", "What is 12 times 7?", "Write a haiku about rain.", "Say hello in French.",
             "List four animals.", "Why is the sky blue? One sentence.", "Count from one to ten."]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


@dataclass
class Stats:
    served: int = 0
    disconnects: int = 0  # intentional: the client closed the stream early
    gave_up: int = 0  # intentional: the client's timeout fired before the answer
    errors: list[str] = field(default_factory=list)
    # (time of the later token, gap in seconds) for every pair of consecutive streamed chunks
    gaps: list[tuple[float, float]] = field(default_factory=list)
    fanout: tuple[float, float] | None = None  # when the fan-out request ran (start, end)


def user_message(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.6:
        return rng.choice(QUESTIONS)
    repeats = rng.randint(8, 20) if kind < 0.9 else rng.randint(50, 90)  # ~200 or ~1000 tokens
    return FILLER * repeats + "\n\nSummarise the text above in one sentence."


async def stream_turn(http: httpx.AsyncClient, stats: Stats, messages: list[dict], rng: random.Random,
                      deadline: float) -> str | None:
    """One streamed chat turn; the reply text, or None when it was cut (on purpose or by an error)."""
    body = {"model": "demo", "messages": messages, "stream": True, "max_tokens": rng.randint(16, 64),
            "temperature": 0.8}
    disconnect_after = rng.randint(1, 8) if rng.random() < 0.1 else None
    text, chunks, last = "", 0, None
    try:
        async with http.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                stats.errors.append(f"status {r.status_code}: {(await r.aread())[:200]!r}")
                return None
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    stats.errors.append(f"in-band error: {event['error'].get('message', '')[:200]}")
                    return None
                delta = event["choices"][0]["delta"].get("content") if event.get("choices") else None
                if delta:
                    now = time.monotonic()
                    if last is not None:
                        stats.gaps.append((now, now - last))
                    last, text, chunks = now, text + delta, chunks + 1
                    if disconnect_after is not None and chunks >= disconnect_after:
                        stats.disconnects += 1
                        return None  # leaving the block closes the connection: the server aborts
        stats.served += 1
        return text
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        if time.monotonic() < deadline:
            stats.errors.append(f"{type(exc).__name__}: {exc}")
        return None


async def impatient(http: httpx.AsyncClient, stats: Stats, rng: random.Random) -> None:
    """A non-streamed request whose client gives up after a moment (the server must abort it)."""
    body = {"model": "demo", "messages": [{"role": "user", "content": user_message(rng)}], "max_tokens": 64}
    try:
        r = await http.post("/v1/chat/completions", json=body, timeout=rng.uniform(0.2, 2.0))
        if r.status_code == 200:
            stats.served += 1
        else:
            stats.errors.append(f"status {r.status_code}: {r.text[:200]}")
    except httpx.TimeoutException:
        stats.gave_up += 1


async def client(i: int, http: httpx.AsyncClient, stats: Stats, deadline: float) -> None:
    rng = random.Random(i)
    messages: list[dict] = []
    while time.monotonic() < deadline:
        if rng.random() < 0.05:
            await impatient(http, stats, rng)
            continue
        if len(messages) >= 8 or rng.random() < 0.15:
            messages = []  # a new conversation; otherwise the next turn reuses the prefix in the KV cache
        messages.append({"role": "user", "content": user_message(rng)})
        reply = await stream_turn(http, stats, messages, rng, deadline)
        if reply is None:
            messages = []
        else:
            messages.append({"role": "assistant", "content": reply})


async def fanout(http: httpx.AsyncClient, stats: Stats, at: float, n: int) -> None:
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    start = time.monotonic()
    body = {"model": "demo", "messages": [{"role": "user", "content": "Invent a name for a boat."}], "n": n,
            "max_tokens": 32, "temperature": 1.0}
    try:
        r = await http.post("/v1/chat/completions", json=body, timeout=1800)
        if r.status_code == 200 and len(r.json()["choices"]) == n:
            stats.served += 1
        else:
            stats.errors.append(f"fan-out: status {r.status_code}: {r.text[:200]}")
    except httpx.HTTPError as exc:
        stats.errors.append(f"fan-out: {type(exc).__name__}: {exc}")
    stats.fanout = (start, time.monotonic())


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "wslm", "serve", "--model", args.model, "--host", "127.0.0.1", "--port", "0",
           "--served-model-name", "demo", "--kv-cache-memory", args.kv_cache_memory, "--max-model-len", "4096",
           "--uvicorn-log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=sys.stderr, text=True, cwd=REPO)
    assert proc.stdout is not None
    for line in proc.stdout:
        event = json.loads(line)
        if event["event"] == "ready":
            return proc, event["url"]
        if event["event"] == "error":
            raise SystemExit(f"the server did not start: {event['message']}")
    raise SystemExit(f"the server exited ({proc.wait()}) before it was ready")


def engine_stats(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    out = {}
    for line in text.splitlines():
        if line.startswith("wslm:") and " " in line:
            name, value = line.rsplit(" ", 1)
            out[name.split("{", 1)[0]] = float(value)
    return out


async def soak(args: argparse.Namespace, url: str) -> Stats:
    stats = Stats()
    start = time.monotonic()
    deadline = start + args.minutes * 60
    limits = httpx.Limits(max_connections=args.streams + 8, max_keepalive_connections=args.streams + 8)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        tasks = [asyncio.create_task(client(i, http, stats, deadline)) for i in range(args.streams)]
        tasks.append(asyncio.create_task(fanout(http, stats, start + args.minutes * 20, args.fanout_n)))
        await asyncio.gather(*tasks)
    return stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="how long the clients run (default 10)")
    ap.add_argument("--streams", type=int, default=64, help="concurrent chat clients (default 64)")
    ap.add_argument("--fanout-n", type=int, default=64, help="n of the fan-out request in the middle (default 64)")
    ap.add_argument("--model", default="demo")
    ap.add_argument("--kv-cache-memory", default="2GiB")
    ap.add_argument("--no-record", action="store_true", help="do not append to docs/benchmarks-log.md")
    ap.add_argument("--note", default="", help="a line added to the record (e.g. that the machine was shared)")
    args = ap.parse_args()

    import psutil

    proc, url = start_server(args)
    try:
        server = psutil.Process(proc.pid)
        httpx.post(url + "/v1/chat/completions", timeout=300,
                   json={"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        rss_start = server.memory_info().rss
        stats = asyncio.run(soak(args, url))
        settle = time.monotonic() + 120
        while time.monotonic() < settle:  # the aborted requests are gone once nothing runs or waits
            e = engine_stats(url)
            if not e.get("wslm:num_requests_running") and not e.get("wslm:num_requests_waiting"):
                break
            time.sleep(0.5)
        e = engine_stats(url)
        leaked = int(e.get("wslm:kv_cache_num_blocks", 0) - e.get("wslm:kv_cache_free_blocks", 0))
        rss_end = server.memory_info().rss
        healthy = httpx.get(url + "/health", timeout=30).status_code == 200
    finally:
        proc.terminate()
        proc.wait(60)
    report = render(args, stats, leaked, rss_start, rss_end, healthy, e)
    print(report)
    if not args.no_record:
        print("recorded in", append_section(f"soak, {args.streams} streams for {args.minutes:g} min "
                                            "(bench/soak.py)", report))
    return 0 if not stats.errors and not leaked and healthy else 1


def render(args, stats: Stats, leaked: int, rss_start: int, rss_end: int, healthy: bool, e: dict) -> str:
    f0, f1 = stats.fanout or (float("inf"), float("inf"))
    phases = {"before": [g for t, g in stats.gaps if t < f0], "during": [g for t, g in stats.gaps if f0 <= t <= f1],
              "after": [g for t, g in stats.gaps if t > f1]}
    rows = [f"| {name} | {len(gaps)} | {percentile(gaps, 0.5) * 1000:.0f} | {percentile(gaps, 0.99) * 1000:.0f} |"
            for name, gaps in phases.items()]
    before = percentile(phases["before"], 0.5)
    during = percentile(phases["during"], 0.5)
    lines = [
        f"`python bench/soak.py --minutes {args.minutes:g} --streams {args.streams} --fanout-n {args.fanout_n}` "
        f"({args.model}, --kv-cache-memory {args.kv_cache_memory}). {args.note}".rstrip(),
        "",
        f"- requests served: {stats.served} (plus {stats.disconnects} streams closed early by their client and "
        f"{stats.gave_up} requests given up by theirs, on purpose)",
        f"- errors: {len(stats.errors)}" + (f" (first: {stats.errors[0]})" if stats.errors else ""),
        f"- KV blocks still held after the end: {leaked}; /health after: {'200' if healthy else 'not 200'}; "
        f"preemptions: {e.get('wslm:num_preemptions_total', 0):.0f}",
        f"- server RSS: {rss_start / 2**20:.0f} MiB at start (after warm-up), {rss_end / 2**20:.0f} MiB at the end",
        f"- fan-out (n={args.fanout_n}, 32 tokens each) took {f1 - f0:.1f} s; median inter-token latency of the "
        f"other streams during it: {during / before:.2f}x the median before" if stats.fanout else "- no fan-out",
        "",
        "| phase (vs the fan-out) | token gaps | p50 ms | p99 ms |",
        "|---|---|---|---|",
        *rows,
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
