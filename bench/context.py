"""Prefill and long-context decode on the demo GGUF, wslm against llama.cpp on the same file, in one run.

    .venv/bin/python bench/context.py [--threads 1 2] [--llama-python /work/llama-venv/bin/python]
    .venv/bin/python bench/context.py --emulate-avx2 --llama-python /work/llama-avx2-venv/bin/python

- prefill: tokens/s to read a --prefill-tokens prompt (default 1024) and produce the first token;
- long decode: tokens/s of --decode-tokens (default 64) generated after a --context-tokens prompt (default
  4000), timed from the first token to the last (the request's own metrics; prefix caching off).
Prompts are token ids of bench/data/fidelity_text.md (EN + ZH + code), the same ids for both. Best of 3.
wslm runs the file kept quantized with dtype=auto (what `wslm serve` does); llama.cpp is llama-cpp-python in
its own venv (see bench/quant.py) with the same thread count. Appends a table to docs/benchmarks-log.md and its figures to bench/results/ (docs/benchmarks.md's table)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TEXT = ROOT / "bench" / "data" / "fidelity_text.md"
REPEATS = 3


def run_wslm(ids: list[int], args) -> dict:
    os.environ["WSLM_GGUF_DEQUANTIZE"] = "0"
    from wslm.backend import LLM, SamplingParams

    # dtype=auto; float32 under --emulate-avx2, as auto picks on a CPU without bf16 arithmetic
    dtype = "float32" if os.environ.get("ATEN_CPU_CAPABILITY") == "avx2" else "auto"
    llm = LLM("demo", dtype=dtype, max_model_len=args.context_tokens + args.decode_tokens + 64, kv_cache_memory=768 << 20,
              enable_prefix_caching=False, max_num_batched_tokens=args.context_tokens + 64)  # fmt: skip
    one = SamplingParams(temperature=0, max_tokens=1)
    more = SamplingParams(temperature=0, max_tokens=args.decode_tokens + 1, ignore_eos=True)

    def run(prompt: list[int], params) -> tuple[float, float]:
        """(seconds to the first token, seconds for the tokens after it), from the request's own metrics."""
        m = llm.generate([{"prompt_token_ids": prompt}], params)[0].metrics
        return m.first_token_time - m.arrival_time, m.finished_time - m.first_token_time

    run(ids[:64], one)  # warm-up
    short, long_ = ids[: args.prefill_tokens], ids[: args.context_tokens]
    prefill = min(run(short, one)[0] for _ in range(REPEATS))
    decode = min(run(long_, more)[1] for _ in range(REPEATS))
    dtype = str(llm.llm_engine.model_config.dtype).removeprefix("torch.")
    return {"prefill": len(short) / prefill, "decode": args.decode_tokens / decode, "dtype": dtype}


def run_llama_cpp(ids: list[int], args) -> dict:
    if args.llama_no_extra_bufts:
        machine.llama_cpp_without_repack()
    from llama_cpp import Llama

    llm = Llama(model_path=args.model_path, n_threads=args.threads, n_threads_batch=args.threads,
                n_ctx=args.context_tokens + args.decode_tokens + 64, n_batch=512, verbose=False)  # fmt: skip

    def prefill_s(prompt: list[int]) -> float:
        llm.reset()
        t = time.perf_counter()
        llm.eval(prompt)
        return time.perf_counter() - t

    prefill_s(ids[:64])  # warm-up
    short, long_ = ids[: args.prefill_tokens], ids[: args.context_tokens]
    prefill = min(prefill_s(short) for _ in range(REPEATS))
    best = float("inf")
    for _ in range(REPEATS):
        prefill_s(long_)
        t = time.perf_counter()
        for _ in range(args.decode_tokens):  # greedy, as wslm's temperature 0
            llm.eval([llm.sample(temp=0.0)])
        best = min(best, time.perf_counter() - t)
    dtype = "Q4_1/Q8_0" + (" (no repack buffers)" if args.llama_no_extra_bufts else "")
    return {"prefill": len(short) / prefill, "decode": args.decode_tokens / best, "dtype": dtype}


def child(args) -> int:
    ids = json.loads(Path(args.ids).read_text())
    if args.child == "wslm":
        import torch

        import wslm.backend  # noqa: F401  (OMP_WAIT_POLICY before torch's first parallel region, as `wslm serve`)

        torch.set_num_threads(args.threads)
        result = run_wslm(ids, args)
    else:
        result = run_llama_cpp(ids, args)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def spawn(name: str, threads: int, ids_file: str, args) -> dict | None:
    python = args.llama_python if name == "llama.cpp" else sys.executable
    if not Path(python).exists():
        print(f"{name}: no {python} (see bench/quant.py for its venv)", file=sys.stderr)
        return None
    cmd = [python, __file__, "--child", name, "--ids", ids_file, "--threads", str(threads),
           "--prefill-tokens", str(args.prefill_tokens), "--context-tokens", str(args.context_tokens),
           "--decode-tokens", str(args.decode_tokens)]  # fmt: skip
    if getattr(args, "llama_no_extra_bufts", False):
        cmd.append("--llama-no-extra-bufts")
    if name == "llama.cpp":
        from wslm.demo import demo_model_path

        cmd += ["--model-path", str(demo_model_path())]
    return machine.run_child(name, cmd, ROOT, args.emulate_avx2)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--prefill-tokens", type=int, default=1024)
    p.add_argument("--context-tokens", type=int, default=4000)
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--llama-python", default="/work/llama-venv/bin/python")
    p.add_argument("--no-write", action="store_true", help="print the table only")
    p.add_argument("--emulate-avx2", action="store_true",
                   help="what a CPU without AVX-512 runs (see bench/quant.py); give it an AVX2 llama.cpp")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--llama-no-extra-bufts", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ids", help=argparse.SUPPRESS)
    p.add_argument("--model-path", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        args.threads = args.threads[0]
        return child(args)

    from fidelity import load_text

    from wslm.backend.loader.model_loader import load_tokenizer
    from wslm.backend.loader.model_source import resolve_model

    ids = load_tokenizer(resolve_model("demo"))(load_text(TEXT), add_special_tokens=False).input_ids
    need = max(args.prefill_tokens, args.context_tokens)
    if len(ids) < need:
        ids = (ids * (need // len(ids) + 1))[:need]  # the text again: still real text to attend over
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(ids, f)
    rows = []
    for threads in args.threads:
        ours, theirs = spawn("wslm", threads, f.name, args), spawn("llama.cpp", threads, f.name, args)
        if theirs is None and not args.llama_no_extra_bufts:  # a segfault in its AMX repack buffers: without them
            args.llama_no_extra_bufts = True
            theirs = spawn("llama.cpp", threads, f.name, args)
        rows.append((threads, ours, theirs))
    os.unlink(f.name)
    lines = [f"Demo GGUF (Q4_1), wslm kept quantized at dtype=auto vs llama-cpp-python on the same file. Prefill: "
             f"a {args.prefill_tokens}-token prompt to its first token; long decode: {args.decode_tokens} tokens after "
             f"a {args.context_tokens}-token prompt, first token to last. Best of {REPEATS}."
             + (" llama.cpp without its repacked (AMX) weight buffers, which crash in this build here."
                if args.llama_no_extra_bufts else "")
             + (f" AVX2 EMULATED (--emulate-avx2): torch held to AVX2, wslm's C kernels built for haswell, dtype=auto "
                f"as float32, llama.cpp from {args.llama_python}." if args.emulate_avx2 else ""), "",
             "| threads | wslm prefill tok/s | llama.cpp prefill tok/s | ratio | wslm decode @ctx tok/s | "
             "llama.cpp decode @ctx tok/s | ratio | wslm dtype |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    def cell(r, key):
        return f"{r[key]:.1f}" if r else "failed"

    def ratio(ours, theirs, key):
        return f"{ours[key] / theirs[key]:.2f}x" if ours and theirs else "-"

    for threads, ours, theirs in rows:
        lines.append(f"| {threads} | {cell(ours, 'prefill')} | {cell(theirs, 'prefill')} | {ratio(ours, theirs, 'prefill')} | "
                     f"{cell(ours, 'decode')} | {cell(theirs, 'decode')} | {ratio(ours, theirs, 'decode')} | "
                     f"{ours['dtype'] if ours else '-'} |")  # fmt: skip
    table = "\n".join(lines) + "\n"
    print(table)
    if not args.no_write:
        model = "demo" + (" (AVX2 emulated)" if args.emulate_avx2 else "")
        records = [{"metric": metric, "model": model, "quant": "Q4_1", "threads": threads, "engine": engine,
                    "value": r[key], "unit": "tok/s", "higher_is_better": True, "loadavg": os.getloadavg()[0]}
                   for threads, ours, theirs in rows for engine, r in (("wslm", ours), ("llama.cpp", theirs)) if r
                   for metric, key in ((f"prefill_{args.prefill_tokens}", "prefill"),
                                       (f"decode_{args.context_tokens // 1000}k", "decode"))]  # fmt: skip
        print("written to", machine.append_section("prefill and long-context decode vs llama.cpp (bench/context.py)",
                                                   table, records, bench="demo-context"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
