"""Weight formats on the demo GGUF, against llama.cpp on the same file and HF transformers, in one run.

    .venv/bin/python bench/quant.py [--tokens 64] [--concurrent 32] [--llama-python /work/llama-venv/bin/python]
    .venv/bin/python bench/quant.py --emulate-avx2 --llama-python /work/llama-avx2-venv/bin/python

Each configuration runs in a fresh process (so resident memory after load is its own): float32 and
bfloat16 (the GGUF dequantized, as transformers loads it), int8 and int4 (dequantized, then quantized on
load), GGUF-native (kept quantized: Q4_1 -> int4, Q8_0 -> int8). Single-stream greedy decode tok/s (best of
3) and --concurrent chats at once (output tok/s). llama.cpp: llama-cpp-python with the same thread count,
single stream (install it in its own venv: `python -m venv /work/llama-venv && /work/llama-venv/bin/pip
install llama-cpp-python`, ~10 min to compile); HF: its padded batch in float32. Appends the table to
docs/benchmarks-log.md.

--emulate-avx2 measures what a CPU without AVX-512 (most desktops) runs, on one that has it: torch held to
its AVX2 kernels (ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2, which also gives its AVX2 int4 pack),
wslm's C kernels built with -march=haswell, and dtype=auto's choice there (float32). Give it a llama.cpp
built the same way: CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
-DGGML_AVX512=OFF" pip install llama-cpp-python, in a venv of its own."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CHAT = [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]
CONFIGS = {  # name: (dtype, quantization, dequantize the GGUF[, environment]); "auto" is a user's default
    "float32": ("float32", None, True),
    "bfloat16": ("bfloat16", None, True),
    "int8": ("auto", "int8", True),
    "int4": ("auto", "int4", True),
    "gguf-native": ("auto", None, False),
    # one sequence's step through the compiled graph instead of the C layers (cpu_native.py)
    "gguf-native no C step": ("auto", None, False, {"WSLM_CPU_NATIVE_DECODE": "0"}),
    # no C++ compiler for inductor: batches run the eager fast path
    "gguf-native eager": ("auto", None, False, {"WSLM_CPU_COMPILE": "0"}),
}


def _rss() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


AVX2_ENV = machine.AVX2_ENV


def best_rate(run, times: int = 3) -> float:
    """The best tokens/s of `times` calls of run(), which returns how many tokens it generated."""
    best = 0.0
    for _ in range(times):
        t = time.perf_counter()
        n = run()
        best = max(best, n / (time.perf_counter() - t))
    return best


def run_wslm(name: str, tokens: int, concurrent: int) -> dict:
    dtype, quantization, dequantize, *env = CONFIGS[name]
    if os.environ.get("ATEN_CPU_CAPABILITY") == "avx2" and dtype == "auto":
        dtype = "float32"  # what dtype=auto picks on a CPU without bf16 arithmetic
    os.environ["WSLM_GGUF_DEQUANTIZE"] = "1" if dequantize else "0"
    os.environ.update(env[0] if env else {})
    from wslm.backend import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM("demo", dtype=dtype, quantization=quantization, kv_cache_memory=256 << 20, max_model_len=1024,
              max_num_seqs=max(concurrent, 1))  # fmt: skip
    load_s = time.perf_counter() - start
    rss = _rss()
    compiled = llm.llm_engine.executor.runner.compiled  # the CPU decode graphs compile in the background: wait
    compile_s = None
    if compiled is not None and compiled.wait():
        compile_s = compiled.compile_seconds
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    llm.chat(CHAT, SamplingParams(temperature=0, max_tokens=4))  # warm-up
    single = best_rate(lambda: len(llm.chat(CHAT, params)[0].outputs[0].token_ids))
    chats = [
        [{"role": "user", "content": f"Write a story about topic number {i}."}] for i in range(concurrent)
    ]
    # Best of 3, as HF's: the first batch also meets the compiled graph's first calls at new shapes.
    batch = best_rate(lambda: sum(len(o.outputs[0].token_ids) for o in llm.chat(chats, params)))
    dtype = str(llm.llm_engine.model_config.dtype).removeprefix("torch.")
    return {"load_s": load_s, "rss": rss, "single": single, "batch": batch, "dtype": dtype, "compile_s": compile_s,
            "rss_end": _rss()}  # fmt: skip


def run_llama_cpp(tokens: int, threads: int, model_path: str, extra_bufts: bool = True) -> dict:
    if not extra_bufts:  # llama.cpp's repacked (AMX) weight buffers off: some builds crash in them
        machine.llama_cpp_without_repack()
    from llama_cpp import Llama

    start = time.perf_counter()
    llm = Llama(model_path=model_path, n_threads=threads, n_ctx=1024, verbose=False)
    load_s = time.perf_counter() - start
    rss = _rss()
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        out = llm.create_chat_completion(CHAT, max_tokens=tokens, temperature=0.0)
        n = out["usage"]["completion_tokens"]
        best = max(best, n / (time.perf_counter() - t))
    return {"load_s": load_s, "rss": rss, "single": best, "batch": None, "dtype": "Q4_1/Q8_0"}


def run_hf(tokens: int, concurrent: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from wslm.demo import demo_model_path

    path = demo_model_path()
    start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    load_s = time.perf_counter() - start
    rss = _rss()
    gen = dict(
        max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=tok.pad_token_id or 0
    )
    with torch.no_grad():
        enc = tok.apply_chat_template(CHAT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        t = time.perf_counter()
        model.generate(**enc, **gen)
        single = tokens / (time.perf_counter() - t)
        tok.padding_side = "left"
        texts = [f"Write a story about topic number {i}." for i in range(concurrent)]
        prompts = [tok.apply_chat_template([{"role": "user", "content": c}], tokenize=False, add_generation_prompt=True)
                   for c in texts]  # fmt: skip
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        def generate_batch() -> int:
            model.generate(**enc, **gen)
            return concurrent * tokens

        batch = best_rate(generate_batch)  # best of 3, as wslm's
    return {"load_s": load_s, "rss": rss, "single": single, "batch": batch, "dtype": "float32"}


def child(args) -> int:
    if args.child != "llama.cpp":  # llama.cpp's venv has no torch
        import torch

        import wslm  # noqa: F401  (before torch: wslm's OMP_WAIT_POLICY default must reach libgomp, as in `wslm serve`)

        torch.set_num_threads(args.threads)
    if args.child == "llama.cpp":
        result = run_llama_cpp(args.tokens, args.threads, args.model_path, not args.llama_no_extra_bufts)
    elif args.child == "hf":
        result = run_hf(args.tokens, args.concurrent)
    else:
        result = run_wslm(args.child, args.tokens, args.concurrent)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def spawn(name: str, args, python: str = sys.executable) -> dict | None:
    cmd = [python, __file__, "--child", name, "--tokens", str(args.tokens), "--concurrent", str(args.concurrent),
           "--threads", str(args.threads)]  # fmt: skip
    if name == "llama.cpp":  # its venv has no wslm dependencies: the parent finds the demo file
        from wslm.demo import demo_model_path

        cmd += ["--model-path", str(demo_model_path())]
        cmd[cmd.index("--threads") + 1] = str(args.llama_threads or args.threads)
        if getattr(args, "llama_no_extra_bufts", False):
            cmd.append("--llama-no-extra-bufts")
    return machine.run_child(name, cmd, ROOT, args.emulate_avx2)


def summary_records(results: dict, args) -> list[dict]:
    """docs/benchmarks-log.md's rows (bench/summarize.py): the kept-quantized row's single stream against llama.cpp,
    its --concurrent chats against HF's batch."""
    model, records = "demo" + (" (AVX2 emulated)" if args.emulate_avx2 else ""), []
    common = {"model": model, "quant": "Q4_1", "unit": "tok/s", "higher_is_better": True, "loadavg": os.getloadavg()[0]}
    for engine, name in (("wslm", "gguf-native"), ("llama.cpp", "llama.cpp"), ("transformers", "hf")):
        r = results.get(name)
        if not r:
            continue
        threads = args.llama_threads or args.threads if engine == "llama.cpp" else args.threads
        records.append({**common, "metric": "single_stream", "threads": threads, "engine": engine, "value": r["single"]})
        if r.get("batch") and engine != "llama.cpp":
            records.append({**common, "metric": f"concurrent_{args.concurrent}", "threads": args.threads,
                            "engine": engine, "value": r["batch"]})  # fmt: skip
    return records


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--concurrent", type=int, default=32)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument(
        "--llama-threads",
        type=int,
        default=None,
        help="llama.cpp's thread count when it must differ (default: --threads)",
    )
    p.add_argument("--llama-python", default="/work/llama-venv/bin/python")
    p.add_argument("--only", nargs="*", default=None, help="subset of configurations")
    p.add_argument("--emulate-avx2", action="store_true", help="measure what a CPU without AVX-512 runs")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--model-path", default=None, help=argparse.SUPPRESS)
    p.add_argument("--llama-no-extra-bufts", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    names = args.only or [*CONFIGS, "llama.cpp", "hf"]
    results = {}
    for name in names:
        if name == "llama.cpp":
            if not Path(args.llama_python).exists():
                print("llama.cpp skipped: no", args.llama_python, file=sys.stderr)
                continue
            results[name] = spawn(name, args, args.llama_python)
            if results[name] is None:  # e.g. a segfault in its AMX repack buffers: once more without them
                args.llama_no_extra_bufts = True
                results[name] = spawn(name, args, args.llama_python)
                if results[name]:
                    results[name]["dtype"] += " (no repack buffers)"
        else:
            results[name] = spawn(name, args)
        print(name, results[name], flush=True)
    size = __import__("wslm.demo", fromlist=["demo_model_path"]).demo_model_path().stat().st_size
    ref = (results.get("llama.cpp") or {}).get("single")
    hf_batch = (results.get("hf") or {}).get("batch")
    rows = ["| weights | compute dtype | single stream tok/s | vs llama.cpp | " f"{args.concurrent} concurrent tok/s | "
            "vs HF batch | RSS after load (MiB) | RSS at the end (MiB) | load s | decode compiled in s |",
            "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, r in results.items():
        if not r:
            rows.append(f"| {name} | failed | | | | | | | | |")
            continue
        end = f"{r['rss_end'] / 2**20:.0f}" if r.get("rss_end") else "-"
        comp = f"{r['compile_s']:.0f}" if r.get("compile_s") else "-"
        vs = f"{r['single'] / ref:.2f}x" if ref else "-"
        b = f"{r['batch']:.1f}" if r["batch"] else "-"
        vb = f"{r['batch'] / hf_batch:.2f}x" if r["batch"] and hf_batch else "-"
        rows.append(
            f"| {name} | {r.get('dtype', '-')} | {r['single']:.1f} | {vs} | {b} | {vb} | {r['rss'] / 2**20:.0f} | "
            f"{end} | {r['load_s']:.1f} | {comp} |"
        )
    body = (
        f"Demo GGUF ({size / 2**20:.0f} MiB, Q4_1 + Q8_0 embeddings), {args.tokens} greedy tokens, "
        f"{args.threads} threads (llama.cpp {args.llama_threads or args.threads}), single stream and --concurrent chats best of 3, each configuration in its own process, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'PASSIVE (wslm default)')}. wslm rows: a lone "
        "sequence's decode step runs every layer in one C call (wslm/backend/platforms/cpu/decode_native.py) where the model is "
        "bf16 or float32 with weights it reads, else the compiled graph; batches run the decode step compiled "
        "(wslm/backend/platforms/cpu/decode_compiled.py; measured after the background compile finished) except in "
        "'eager' rows. The machine may be shared with other jobs: compare rows of one run, not absolute "
        "numbers." + (" AVX2 EMULATED (--emulate-avx2): torch held to AVX2, wslm's C kernels built for haswell, "
                      "dtype=auto as float32, llama.cpp from " + args.llama_python + "." if args.emulate_avx2 else "")
        + "\n\n" + "\n".join(rows)
    )
    print(body)
    print("written to", machine.append_section("weight formats on the demo GGUF (bench/quant.py)", body,
                                               summary_records(results, args), bench="demo-quant"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
