"""Does a pooled model's load stall another model's streams? (issue 33's target: time to first token of the
loaded model within 20% while a 3B model loads beside it; no stalled streams.)

One `wslm serve` with model A (the demo model) loaded at start and model B in its --model-pool
(~/.cache/wslm-bench/3b-Q4_K_M.gguf when present, else a second copy of the demo model). Each round:
unload B, stream --streams completions from A one after another (the baseline), then ask the server to load B
(POST /v1/models/load) and stream from A the same way, back to back, while B's state is "loading". A stream
counts for the "during the load" side when it started after the load began and its first token came before
the load ended. Reports the time to first token (median, p90) and the gaps between tokens (median, p99, max)
of both sides, the load times, and how long GET /health took meanwhile (a probe every 50 ms: whether the
server process itself stalled, the event loop or the GIL, apart from A's core getting less CPU).

    .venv/bin/python bench/pool_load_stall.py                 # 3 rounds
    .venv/bin/python bench/pool_load_stall.py --rounds 5 --max-tokens 32 --b-model PATH

Both models run with --enforce-eager (no background compile: it would load the CPU beside the
measurement for minutes). Each model's core is a process of its own (engine/core_client.py), so B's load
takes CPU from A's core but never holds A's engine thread or the event loop; on a machine with fewer cores
than the two cores' threads the CPU itself is shared, which is what this measures. Prints the machine and its
load average before and after (a shared machine's neighbours show up in both sides alike: rounds alternate).
Not part of the test suite."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
BIG = Path.home() / ".cache" / "wslm-bench" / "3b-Q4_K_M.gguf"


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def start_server(a_model: str, b_model: str, kv: str) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "wslm", "serve", "--model", a_model, "--served-model-name", "A",
           "--model-pool", f"B={b_model}", "--max-loaded-models", "2", "--model-ttl", "-1", "--port", "0",
           "--kv-cache-memory", kv, "--max-model-len", "2048", "--enforce-eager", "--uvicorn-log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout is not None
    for line in proc.stdout:
        event = json.loads(line)
        if event["event"] == "ready":
            return proc, event["url"]
        if event["event"] == "error":
            raise SystemExit(f"the server failed to start: {event['message']}")
    raise SystemExit(f"the server exited ({proc.wait()}) before it was ready")


def stream_once(client: httpx.Client, url: str, max_tokens: int) -> tuple[float, list[float], float, float]:
    """(time to first token, gaps between tokens, start, end) of one streamed completion from A."""
    body = {"model": "A", "prompt": "Write a short story about a lighthouse keeper.", "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}
    start = time.monotonic()
    stamps: list[float] = []
    with client.stream("POST", url + "/v1/completions", json=body, timeout=300) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if chunk.get("choices"):
                    stamps.append(time.monotonic())
    end = time.monotonic()
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return stamps[0] - start, gaps, start, end


class HealthProbe:
    """GET /health every 50 ms in a thread; the round-trip times while `on`."""

    def __init__(self, url: str) -> None:
        self.url, self.on, self.stop = url, False, False
        self.times: dict[bool, list[float]] = {False: [], True: []}
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with httpx.Client() as client:
            while not self.stop:
                on = self.on
                t0 = time.monotonic()
                client.get(self.url + "/health", timeout=60)
                self.times[on].append(time.monotonic() - t0)
                time.sleep(0.05)


def b_state(client: httpx.Client, url: str) -> str:
    return client.get(url + "/v1/models/B", timeout=30).json().get("state", "?")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--streams", type=int, default=4, help="baseline streams from A per round")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--b-model", default=None, help="the model loaded beside A (default: the 3B Q4_K_M file)")
    ap.add_argument("--kv-cache-memory", default="256MiB")
    args = ap.parse_args()
    from wslm.demo import demo_model_path

    a_model = str(demo_model_path())
    b_model = args.b_model or (str(BIG) if BIG.exists() else a_model)
    load_before = os.getloadavg()
    proc, url = start_server(a_model, b_model, args.kv_cache_memory)
    base_ttft: list[float] = []
    base_gaps: list[float] = []
    load_ttft: list[float] = []
    load_gaps: list[float] = []
    load_times: list[float] = []
    timeline: list[tuple[int, float, float]] = []  # (round, start after the load began, ttft) during loads
    probe = None
    try:
        with httpx.Client() as client:
            stream_once(client, url, 8)  # first-request costs out of the way
            probe = HealthProbe(url)
            for rnd in range(args.rounds):
                if b_state(client, url) == "loaded":
                    client.post(url + "/v1/models/unload", json={"model": "B"}, timeout=120).raise_for_status()
                for _ in range(args.streams):
                    ttft, gaps, _, _ = stream_once(client, url, args.max_tokens)
                    base_ttft.append(ttft)
                    base_gaps += gaps
                done: dict = {}

                def load(done: dict = done) -> None:
                    t0 = time.monotonic()
                    r = httpx.post(url + "/v1/models/load", json={"model": "B"}, timeout=900)
                    done.update(status=r.status_code, seconds=time.monotonic() - t0, text=r.text[:300])

                loader = threading.Thread(target=load)
                began = time.monotonic()
                probe.on = True
                loader.start()
                while b_state(client, url) != "loading" and loader.is_alive():
                    time.sleep(0.01)
                counted = 0
                while loader.is_alive():
                    ttft, gaps, start, end = stream_once(client, url, args.max_tokens)
                    if loader.is_alive() or start + ttft < began + done.get("seconds", 1e9):
                        load_ttft.append(ttft)
                        load_gaps += gaps
                        timeline.append((rnd + 1, round(start - began, 2), round(ttft * 1e3, 1)))
                        counted += 1
                loader.join()
                probe.on = False
                if done.get("status") != 200:
                    raise SystemExit(f"loading B failed: {done}")
                load_times.append(done["seconds"])
                print(f"round {rnd + 1}: B loaded in {done['seconds']:.1f} s, {counted} streams of A inside the "
                      f"load; load average {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        if probe is not None:
            probe.stop = True
        proc.terminate()
        proc.wait(120)
    load_after = os.getloadavg()

    def summary(ttft: list[float], gaps: list[float]) -> dict:
        return {"streams": len(ttft), "ttft_median_ms": 1e3 * statistics.median(ttft) if ttft else None,
                "ttft_p90_ms": 1e3 * percentile(ttft, 0.9), "gap_median_ms": 1e3 * percentile(gaps, 0.5),
                "gap_p99_ms": 1e3 * percentile(gaps, 0.99), "gap_max_ms": 1e3 * max(gaps) if gaps else None}

    result = {
        "machine": f"{cpu_name()}, {os.cpu_count()} CPUs",
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "a_model": a_model, "b_model": b_model, "max_tokens": args.max_tokens,
        "b_load_seconds": [round(x, 2) for x in load_times],
        "baseline": summary(base_ttft, base_gaps),
        "during_load": summary(load_ttft, load_gaps),
        "health_ms_baseline": {"median": 1e3 * percentile(probe.times[False], 0.5),
                               "max": 1e3 * max(probe.times[False], default=float("nan"))},
        "health_ms_during_load": {"median": 1e3 * percentile(probe.times[True], 0.5),
                                  "max": 1e3 * max(probe.times[True], default=float("nan"))},
        "during_load_streams": [{"round": r, "start_s": s, "ttft_ms": t} for r, s, t in timeline],
    }
    if base_ttft and load_ttft:
        result["ttft_ratio_median"] = statistics.median(load_ttft) / statistics.median(base_ttft)
        result["gap_ratio_median"] = percentile(load_gaps, 0.5) / percentile(base_gaps, 0.5)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
