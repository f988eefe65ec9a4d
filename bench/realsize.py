"""wslm against llama.cpp (and transformers) on random-weight files of real shapes, in one run.

    .venv/bin/python bench/realsize.py --models 3b --quants Q4_K_M Q4_0 --threads 1 2 \\
        --metrics decode_0 prefill_512 load_warm memory [--repeats 3] [--llama-python /work/llama-venv/bin/python]
    .venv/bin/python bench/realsize.py --models 3b-hf --metrics load_warm decode_0 memory   # safetensors bf16
    .venv/bin/python bench/realsize.py --quick --models tiny --quants F16 --engines wslm      # what the test runs

Files (bench/realsize_files.py): Llama-3.2-3B and Llama-3.1-8B shapes, a Qwen3-30B-A3B layer with 24 of its 48
layers ("moe"), random weights (normal * 0.02), the demo's tokenizer and 49152-token vocabulary; an F16 base
written tensor by tensor, quantized by llama.cpp's own quantizer (llama_model_quantize) to --quants; cached in
$WSLM_BENCH_CACHE or ~/.cache/wslm-bench/. "3b-hf" is the 3B shape as an HF safetensors folder in bf16, run by
wslm and by transformers' from_pretrained.

Each measurement is a fresh process per engine, interleaved (wslm, llama.cpp, llama.cpp, wslm, ...), --repeats
times; the best of the repeats is the figure, and every sample keeps the load average it ran under. wslm runs
the file as `wslm serve` would: LLM(path, dtype="auto"), kept quantized, prefix caching off. llama.cpp is
llama-cpp-python in its own venv (--llama-python or $WSLM_LLAMA_PYTHON). Metrics:
- decode_0, decode_4k: tokens/s of --decode-tokens greedy tokens after a 16-token / 4000-token prompt, first
  token to last; with the roofline: the machine's read bandwidth (a torch sum of a 1 GiB float32 tensor on that
  many threads: a decode step reads its weights and writes next to nothing), measured again just before each
  process (other work on the machine changes it), ÷ the bytes of weights a token reads (the file's; for wslm
  also what it holds), and each engine's tok/s as a % of that; the copy bandwidth (bytes read + written by a
  large numpy copy) is kept beside it, and the % of it (roofline_pct_of_copy);
- prefill_512, prefill_2k: seconds from a 512 / 2048-token prompt to its first token;
- load_warm: seconds to load with the file in the page cache; load_cold: after dropping the page cache
  (`echo 3 > /proc/sys/vm/drop_caches` when permitted, else posix_fadvise(DONTNEED) on the file; the record
  says which); load_first: wslm's first load of a file, with its tokenizer conversion (recorded when it happens);
- memory: resident after load and peak during load, each split into file-backed and anonymous
  (/proc/PID/status RssFile / RssAnon, sampled every 20 ms during the load; VmHWM for the total peak).
Results: one JSON record per metric × model × quant × threads × engine in bench/results/ (bench/summarize.py
turns them into docs/benchmarks.md's table)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = machine.RESULTS
METRICS = ("decode_0", "decode_4k", "prefill_512", "prefill_2k", "load_warm", "load_cold", "memory")
PROMPTS = {"decode_0": 16, "decode_4k": 4000, "prefill_512": 512, "prefill_2k": 2048}
PEERS = {"gguf": "llama.cpp", "hf": "transformers"}


# ---- in the child process (wslm's venv or llama.cpp's: stdlib only at the top) ----

def _status() -> dict[str, int]:
    out = {}
    for line in open("/proc/self/status"):
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
            out[key] = int(rest.split()[0]) * 1024
    return out


class PeakSampler:
    """Highest RssAnon, RssFile and their sum seen while the load runs (a thread reading /proc every 20 ms)."""

    def __init__(self) -> None:
        self.peak = {"anon": 0, "file": 0, "total": 0}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.02):
            s = _status()
            anon, file = s.get("RssAnon", 0), s.get("RssFile", 0) + s.get("RssShmem", 0)
            self.peak = {"anon": max(self.peak["anon"], anon), "file": max(self.peak["file"], file),
                         "total": max(self.peak["total"], anon + file)}  # fmt: skip

    def done(self) -> dict[str, int]:
        self.stop.set()
        self.thread.join()
        self.peak["hwm"] = _status().get("VmHWM", 0)
        return self.peak


def _memory(before: dict, peak: dict) -> dict:
    after = _status()
    return {"before": before.get("VmRSS", 0), "before_anon": before.get("RssAnon", 0),
            "before_file": before.get("RssFile", 0) + before.get("RssShmem", 0), "after_anon": after.get("RssAnon", 0),
            "after_file": after.get("RssFile", 0) + after.get("RssShmem", 0), "after": after.get("VmRSS", 0),
            "peak_anon": peak["anon"], "peak_file": peak["file"], "peak": max(peak["total"], peak["hwm"])}  # fmt: skip


def _memory_end(out: dict) -> dict:
    """out with the resident memory now, the engine still loaded: after the runs a mapped file's pages are
    resident once a token has read them."""
    end = _status()
    out["memory_end"] = {"total": end.get("VmRSS", 0), "anon": end.get("RssAnon", 0),
                         "file": end.get("RssFile", 0) + end.get("RssShmem", 0)}  # fmt: skip
    return out


def _context_needed(metrics: list[str], tokens: int) -> int:
    return max([PROMPTS[m] for m in metrics if m in PROMPTS] + [16]) + tokens + 64


def child_wslm(args, ids: list[int]) -> dict:
    os.environ["WSLM_GGUF_DEQUANTIZE"] = "0"  # kept quantized, as `wslm serve` (the test suite sets 1)
    import torch

    import wslm.backend  # noqa: F401  (OMP_WAIT_POLICY before torch's first parallel region, as `wslm serve`)

    torch.set_num_threads(args.threads)
    from wslm.backend import LLM, SamplingParams
    from wslm.backend.modeling.weight_bytes import _walk, weight_bytes

    before, sampler = _status(), PeakSampler()
    start = time.perf_counter()
    # dtype=auto, but float32 under --emulate-avx2: what auto picks on a CPU without bf16 arithmetic
    dtype = "float32" if os.environ.get("ATEN_CPU_CAPABILITY") == "avx2" else "auto"
    llm = LLM(args.path, dtype=dtype, max_model_len=_context_needed(args.metrics, args.tokens),
              enable_prefix_caching=False, max_num_batched_tokens=max(2048, _context_needed(args.metrics, 0)))  # fmt: skip
    load_s = time.perf_counter() - start
    out = {"load_s": load_s, "memory": _memory(before, sampler.done())}
    executor = llm.llm_engine.executor
    model = executor.runner.model
    out["held_bytes"] = sum(weight_bytes(model).values())
    seen: set[int] = set()  # what a token reads of it: the layers and the LM head, not the embedding table
    out["held_read_bytes"] = _walk(model.layers, seen) + _walk(model.lm_head, seen)
    out["kv_bytes"] = int(getattr(executor, "kv_cache_bytes", 0) or 0)
    out["dtype"] = str(llm.llm_engine.model_config.dtype).removeprefix("torch.")

    def run(prompt: list[int], n: int) -> tuple[float, float]:
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        m = llm.generate([{"prompt_token_ids": prompt}], params)[0].metrics
        return m.first_token_time - m.arrival_time, m.finished_time - m.first_token_time

    if any(m in PROMPTS for m in args.metrics):
        run(ids[:16], 4)  # warm-up
    for m in args.metrics:
        if m.startswith("prefill"):
            out[m] = min(run(ids[: PROMPTS[m]], 1)[0] for _ in range(args.inner))
        elif m.startswith("decode"):
            out[m] = args.tokens / min(run(ids[: PROMPTS[m]], args.tokens + 1)[1] for _ in range(args.inner))
    return _memory_end(out)


def child_llama(args, ids: list[int]) -> dict:
    if args.llama_no_extra_bufts:
        machine.llama_cpp_without_repack()
    from llama_cpp import Llama

    before, sampler = _status(), PeakSampler()
    start = time.perf_counter()
    llm = Llama(model_path=args.path, n_threads=args.threads, n_threads_batch=args.threads,
                n_ctx=_context_needed(args.metrics, args.tokens), n_batch=512, verbose=False)  # fmt: skip
    load_s = time.perf_counter() - start
    out = {"load_s": load_s, "memory": _memory(before, sampler.done()), "dtype": "file's types"}

    def prefill_s(prompt: list[int]) -> float:
        llm.reset()
        t = time.perf_counter()
        llm.eval(prompt)
        return time.perf_counter() - t

    if any(m in PROMPTS for m in args.metrics):
        prefill_s(ids[:16])  # warm-up
    for m in args.metrics:
        if m.startswith("prefill"):
            out[m] = min(prefill_s(ids[: PROMPTS[m]]) for _ in range(args.inner))
        elif m.startswith("decode"):
            best = float("inf")
            for _ in range(args.inner):
                prefill_s(ids[: PROMPTS[m]])
                llm.eval([llm.sample(temp=0.0)])  # the first token, as wslm's timing starts after it
                t = time.perf_counter()
                for _ in range(args.tokens):  # greedy, as wslm's temperature 0
                    llm.eval([llm.sample(temp=0.0)])
                best = min(best, time.perf_counter() - t)
            out[m] = args.tokens / best
    return _memory_end(out)


def child_transformers(args, ids: list[int]) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    before, sampler = _status(), PeakSampler()
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args.path, dtype=torch.bfloat16).eval()
    load_s = time.perf_counter() - start
    out = {"load_s": load_s, "memory": _memory(before, sampler.done()), "dtype": "bfloat16"}

    def gen(prompt: list[int], n: int) -> float:
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           pad_token_id=0)  # fmt: skip
        return time.perf_counter() - t

    if any(m in PROMPTS for m in args.metrics):
        gen(ids[:16], 2)  # warm-up
    for m in args.metrics:
        prompt = ids[: PROMPTS.get(m, 16)]
        if m.startswith("prefill"):
            out[m] = min(gen(prompt, 1) for _ in range(args.inner))
        elif m.startswith("decode"):  # the tokens after the first: a whole generate less a one-token one
            out[m] = args.tokens / min(gen(prompt, args.tokens + 1) - gen(prompt, 1) for _ in range(args.inner))
    return _memory_end(out)


def child(args) -> int:
    ids = json.loads(Path(args.ids).read_text())
    if args.child == "wslm-repacked":  # the GGUF weights repacked at load (WSLM_GGUF_BLOCKS=0), not in blocks
        os.environ["WSLM_GGUF_BLOCKS"] = "0"
    run = {"wslm": child_wslm, "wslm-repacked": child_wslm, "llama.cpp": child_llama,
           "transformers": child_transformers}[args.child]
    result = run(args, ids)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


# ---- in the parent ----

def bandwidth(threads: int, size: int = 1 << 30) -> dict[str, float]:
    """Bytes/s of reading (torch sum of a float32 tensor of `size` bytes on `threads` threads) and of copying
    (bytes read + written by a numpy copy of `size` bytes split over `threads` threads), best of 3 each."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    big = torch.ones(size // 4, dtype=torch.float32)
    read = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        big.sum()
        read = min(read, time.perf_counter() - t)
    del big
    torch.set_num_threads(before)
    src, dst = np.ones(size, dtype=np.uint8), np.zeros(size, dtype=np.uint8)
    parts = [(slice(i * size // threads, (i + 1) * size // threads)) for i in range(threads)]
    copy = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(3):
            t = time.perf_counter()
            list(pool.map(lambda s: np.copyto(dst[s], src[s]), parts))
            copy = min(copy, time.perf_counter() - t)
    return {"read": size / read, "copy": 2 * size / copy}


def evict(path: Path) -> str:
    """Drop the file from the page cache; returns how."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "drop_caches"
    except OSError:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return "fadvise"


def warm(path: Path) -> None:
    """Read the file (or folder) once so that a 'warm' load finds it in the page cache."""
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    for f in files:
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass


class Recorder:
    """Collects samples per (model, quant, threads, engine, metric) and writes the JSON after every child."""

    def __init__(self, out: Path | None, meta: dict) -> None:
        self.out, self.meta = out, meta
        self.samples: dict[tuple, list[dict]] = {}

    def add(self, key: tuple, value: float, load: float, extra: dict | None = None) -> None:
        self.samples.setdefault(key, []).append({"value": value, "loadavg": load, **(extra or {})})
        self.write()

    def records(self) -> list[dict]:
        out = []
        for (model, quant, threads, engine, metric, unit, higher), samples in self.samples.items():
            best = (max if higher else min)(samples, key=lambda s: s["value"])
            out.append({"metric": metric, "model": model, "quant": quant, "threads": threads,
                        "engine": engine, "value": best["value"], "unit": unit, "higher_is_better": higher,
                        "loadavg": best["loadavg"], "samples": [s["value"] for s in samples],
                        "loadavgs": [s["loadavg"] for s in samples],
                        **{k: v for k, v in best.items() if k not in ("value", "loadavg")}, **self.meta})  # fmt: skip
        return out

    def write(self) -> None:
        if self.out:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self.out.write_text(json.dumps(self.records(), indent=1) + "\n")


def spawn(engine: str, path: Path, threads: int, metrics: list[str], args, ids_file: str) -> dict | None:
    python = args.llama_python if engine == "llama.cpp" else sys.executable
    cmd = [python, __file__, "--child", engine, "--path", str(path), "--ids", ids_file, "--threads", str(threads),
           "--tokens", str(args.decode_tokens), "--inner", str(args.inner), "--child-metrics", ",".join(metrics)]  # fmt: skip
    if engine == "llama.cpp" and args.llama_no_extra_bufts:
        cmd.append("--llama-no-extra-bufts")
    result = machine.run_child(f"{engine} {path.name} x{threads}", cmd, ROOT, args.emulate_avx2)
    if result is None and engine == "llama.cpp" and not args.llama_no_extra_bufts:
        args.llama_no_extra_bufts = True  # a crash in its AMX repack buffers on some builds: once more without
        cmd.append("--llama-no-extra-bufts")
        result = machine.run_child(f"{engine} {path.name} x{threads}", cmd, ROOT, args.emulate_avx2)
    return result


def record_child(rec: Recorder, key: tuple, r: dict, metrics: list[str], load: float, roof: dict) -> None:
    model, quant, threads, engine = key
    mem = r["memory"]
    if "load_warm" in metrics:
        rec.add((*key, "load_warm", "s", False), r["load_s"], load)
    if "memory" in metrics:
        rec.add((*key, "rss_after_load", "bytes", False), mem["after"], load,
                {"file_backed": mem["after_file"], "anonymous": mem["after_anon"], "before_load": mem["before"],
                 "before_file_backed": mem["before_file"], "before_anonymous": mem["before_anon"],
                 "kv_bytes": r.get("kv_bytes") or roof.get("kv_per_token", 0) * _context_needed(metrics, roof["tokens"]),
                 "file_bytes": roof["file"]})  # fmt: skip
        rec.add((*key, "peak_during_load", "bytes", False), mem["peak"], load,
                {"file_backed": mem["peak_file"], "anonymous": mem["peak_anon"], "before_load": mem["before"],
                 "file_bytes": roof["file"]})  # fmt: skip
    if "memory" in metrics and any(m in PROMPTS for m in metrics) and r.get("memory_end"):
        end = r["memory_end"]
        rec.add((*key, "rss_after_run", "bytes", False), end["total"], load,
                {"file_backed": end["file"], "anonymous": end["anon"], "file_bytes": roof["file"]})
    for m in metrics:
        if m.startswith("prefill") and m in r:
            rec.add((*key, m, "s", False), r[m], load, {"tokens_per_s": PROMPTS[m] / r[m]})
        elif m.startswith("decode") and m in r:
            bws = roof["bandwidth"][threads]
            bw = bws["read"]
            extra = {"bandwidth_bytes_per_s": bw, "bandwidth_of": "read (torch sum)", "copy_bytes_per_s": bws["copy"],
                     "read_bytes_per_token": roof["read"],
                     "roofline_pct": 100 * r[m] / (bw / roof["read"]) if roof["read"] else None,
                     "roofline_pct_of_copy": 100 * r[m] / (bws["copy"] / roof["read"]) if roof["read"] else None}  # fmt: skip
            if r.get("held_read_bytes"):  # wslm: what it holds (repacked), as a token reads it
                extra["held_bytes"], extra["held_read_bytes"] = r["held_bytes"], r["held_read_bytes"]
                extra["roofline_pct_of_held"] = 100 * r[m] / (bw / r["held_read_bytes"])
            rec.add((*key, m, "tok/s", True), r[m], load, extra)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["3b"], help="3b, 8b, moe, tiny; 3b-hf for the safetensors folder")
    p.add_argument("--quants", nargs="+", default=["Q4_K_M", "Q4_0"], help="Q4_K_M Q5_K_M Q6_K Q8_0 Q4_0 F16 BF16")
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--metrics", nargs="+", default=["decode_0", "prefill_512", "load_warm", "memory"],
                   choices=METRICS)
    p.add_argument("--engines", nargs="+", default=None,
                   help="default: wslm and the peer (llama.cpp / transformers); wslm-repacked: wslm with "
                        "WSLM_GGUF_BLOCKS=0")
    p.add_argument("--repeats", type=int, default=3, help="fresh processes per engine; the best is the figure")
    p.add_argument("--inner", type=int, default=2, help="runs of each speed metric inside one process")
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--quick", action="store_true", help="1 repeat, 1 inner run, 16 decode tokens")
    p.add_argument("--llama-python", default=os.environ.get("WSLM_LLAMA_PYTHON", "/work/llama-venv/bin/python"),
                   help="python of llama-cpp-python's own venv (env WSLM_LLAMA_PYTHON)")
    p.add_argument("--emulate-avx2", action="store_true",
                   help="what a CPU without AVX-512 runs (torch held to AVX2, wslm's C kernels built for haswell, "
                        "float32); give it an AVX2 llama.cpp (bench/quant.py says how to build one)")
    p.add_argument("--out", default=None, help="JSON file (default bench/results/realsize-DATE.json)")
    p.add_argument("--no-write", action="store_true", help="print, write no JSON")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--path", help=argparse.SUPPRESS)
    p.add_argument("--ids", help=argparse.SUPPRESS)
    p.add_argument("--tokens", type=int, help=argparse.SUPPRESS)
    p.add_argument("--child-metrics", default="", help=argparse.SUPPRESS)
    p.add_argument("--llama-no-extra-bufts", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        args.threads, args.metrics = args.threads[0], [m for m in args.child_metrics.split(",") if m]
        return child(args)
    if args.quick:
        args.repeats, args.inner, args.decode_tokens = 1, 1, 16

    import random

    import realsize_files as files

    llama_ok = Path(args.llama_python).exists()
    stamp = datetime.datetime.now(datetime.timezone.utc)
    meta = {"bench": "realsize", "date": stamp.strftime("%Y-%m-%d %H:%M UTC"), "machine": machine.describe(),
            "machine_short": machine.short(), "commit": machine.git_commit(), "llama_python": args.llama_python if llama_ok else None}  # fmt: skip
    out = None if args.no_write else Path(args.out or RESULTS / f"realsize-{stamp:%Y%m%d-%H%M}.json")
    rec = Recorder(out, meta)
    bw = {t: bandwidth(t) for t in args.threads}
    print("bandwidth (GB/s):", {t: f"read {b['read'] / 1e9:.1f}, copy {b['copy'] / 1e9:.1f}" for t, b in bw.items()},
          flush=True)  # fmt: skip
    rng = random.Random(0)
    ids = [rng.randrange(100, 49000) for _ in range(max(PROMPTS.values()))]  # the demo vocabulary's range
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(ids, f)
    try:
        for model in args.models:
            hf = model.endswith("-hf")
            label = model + (" (AVX2 emulated)" if args.emulate_avx2 else "")
            kind = "hf" if hf else "gguf"
            engines = args.engines or ["wslm", PEERS[kind]]
            if "llama.cpp" in engines and not llama_ok and not hf:
                print(f"llama.cpp skipped: no {args.llama_python} (give --llama-python or WSLM_LLAMA_PYTHON)",
                      file=sys.stderr)  # fmt: skip
                engines = [e for e in engines if e != "llama.cpp"]
            for quant in ["bf16"] if hf else args.quants:
                path = files.hf_folder(model.removesuffix("-hf")) if hf else files.gguf_file(
                    model, quant, args.llama_python if llama_ok else None)
                if path.name.endswith("-ggufpy.gguf"):
                    quant += " (gguf-py)"  # not llama.cpp's file (realsize_files.quantize_gguf_py)
                if hf:
                    size = sum(p.stat().st_size for p in path.glob("*.safetensors"))
                    roof = {"read": size, "file": size}
                else:
                    sizes = files.weight_bytes_per_token(path)
                    roof = {"read": sizes["read_per_token"], "file": sizes["file_bytes"]}
                roof["bandwidth"], roof["tokens"] = bw, args.decode_tokens
                shape = files.SHAPES.get(model.removesuffix("-hf"))
                if shape:  # llama.cpp's f16 KV cache per token of context (its n_ctx is what the child asks)
                    roof["kv_per_token"] = shape.layers * 2 * shape.kv_heads * shape.dim_head * 2
                print(f"{model} {quant}: {path} ({roof['file'] / 1e9:.2f} GB, {roof['read'] / 1e9:.2f} GB read "
                      "per token)", flush=True)  # fmt: skip
                first_load = "wslm" in engines and not hf and _needs_conversion(path)
                warm(path)
                timed = [m for m in args.metrics if m != "load_cold"]
                for rep in range(args.repeats):
                    for threads in args.threads:
                        order = engines if rep % 2 == 0 else engines[::-1]
                        for engine in order:
                            load = os.getloadavg()[0]
                            if any(m.startswith("decode") for m in timed):  # the bandwidth of this moment
                                roof["bandwidth"] = {**roof["bandwidth"], threads: bandwidth(threads, 1 << 29)}
                            r = spawn(engine, path, threads, timed, args, f.name)
                            load = max(load, os.getloadavg()[0])
                            print(f"  rep {rep + 1} {engine} x{threads}: {_brief(r)} (load {load:.2f})", flush=True)
                            if r is None:
                                continue
                            key = (label, quant, threads, engine)
                            if engine == "wslm" and first_load:
                                rec.add((*key, "load_first", "s", False), r["load_s"], load,
                                        {"note": "the first load of this file, with its tokenizer conversion"})
                                first_load = False
                                record_child(rec, key, r, [m for m in timed if m != "load_warm"], load, roof)
                            else:
                                record_child(rec, key, r, timed, load, roof)
                if "load_cold" in args.metrics:
                    for rep in range(args.repeats):
                        for engine in engines if rep % 2 == 0 else engines[::-1]:
                            how = evict(path)
                            load = os.getloadavg()[0]
                            r = spawn(engine, path, args.threads[-1], [], args, f.name)
                            print(f"  cold rep {rep + 1} {engine}: {_brief(r)} ({how})", flush=True)
                            if r:
                                rec.add((label, quant, args.threads[-1], engine, "load_cold", "s", False), r["load_s"],
                                        max(load, os.getloadavg()[0]), {"evicted_by": how})  # fmt: skip
                    warm(path)
    finally:
        os.unlink(f.name)
    rows = rec.records()
    for r in rows:
        print(f"{r['metric']:18} {r['model']:6} {r['quant']:7} x{r['threads']} {r['engine']:12} "
              f"{_fmt(r['value'], r['unit'])}  (load {r['loadavg']:.2f})")  # fmt: skip
    if out:
        print("written to", out)
    return 0


def _needs_conversion(path: Path) -> bool:
    from wslm.backend.loader.model_source import resolve_model

    try:
        return resolve_model(str(path)).converted() is None
    except Exception:  # noqa: BLE001  (the record is optional)
        return False


def _brief(r: dict | None) -> str:
    if r is None:
        return "failed"
    keys = [k for k in r if k.startswith(("decode", "prefill"))]
    return ", ".join([f"load {r['load_s']:.1f}s", f"rss {r['memory']['after'] / 2**30:.2f} GiB"]
                     + [f"{k} {r[k]:.2f}" for k in keys])  # fmt: skip


def _fmt(value: float, unit: str) -> str:
    return f"{value / 2**30:.2f} GiB" if unit == "bytes" else f"{value:.2f} {unit}"


if __name__ == "__main__":
    raise SystemExit(main())
