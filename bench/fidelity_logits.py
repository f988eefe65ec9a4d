"""Logits on a fixed prompt, wslm against llama.cpp on the same GGUF file: for files whose perplexity means
nothing (bench/realsize_files.py's random-weight 3B files), the engines' arithmetic can still be compared.

    .venv/bin/python bench/fidelity_logits.py FILE.gguf [FILE.gguf ...] [--tokens 64 63] [--threads 1]
        [--llama-python /work/llama-venv/bin/python] [--no-docs]

The prompt: the first N token ids of bench/data/fidelity_text.md with the demo's tokenizer (the random files
carry the demo's vocabulary). Each engine runs it as one prefill in its own process and returns the logits of
every position: wslm with its blocks in place (WSLM_GGUF_BLOCKS=1, the default), wslm repacked
(WSLM_GGUF_BLOCKS=0), llama.cpp (llama-cpp-python, logits_all). Several --tokens counts exercise different
kernels: 64 rows and more take wslm's tiled block GEMM (gguf_blocks.PREFILL_ROWS), fewer its row kernel (the
one decode steps use). Per pair: max and mean |difference| of the logits, the logits' own spread (standard
deviation, to read the differences against), top-1 agreement over the positions and the mean KL(first || second)
of the pair's distributions. Writes bench/results/fidelity_logits-DATE.json and a section in
docs/benchmarks-log.md unless --no-docs."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
ENGINES = {"wslm blocks": {"WSLM_GGUF_BLOCKS": "1"}, "wslm repacked": {"WSLM_GGUF_BLOCKS": "0"}, "llama.cpp": {}}


def prompt_ids(n: int) -> list[int]:
    from transformers import AutoTokenizer

    sys.path.insert(0, str(ROOT))
    from wslm.demo import demo_model_path

    sys.path.insert(0, str(BENCH))
    import fidelity

    demo = demo_model_path()
    tok = AutoTokenizer.from_pretrained(str(demo.parent), gguf_file=demo.name)
    ids = tok(fidelity.load_text(), add_special_tokens=False).input_ids
    return ids[:n]


def child_wslm(path: str, ids: list[int], out: Path, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    from wslm.backend import LLM, SamplingParams

    llm = LLM(path, max_model_len=len(ids) + 1, max_num_seqs=1, kv_cache_memory=256 << 20,
              max_num_batched_tokens=max(2048, len(ids)), enable_prefix_caching=False)  # fmt: skip
    model = llm.llm_engine.executor.runner.model
    forward = model.forward
    captured: list[torch.Tensor] = []

    def capture(*a, **k):
        r = forward(*a, **k)
        captured.append(r.detach().float().clone())
        return r

    model.forward = capture  # bench/fidelity.py's hook: the logits the model returned
    llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0))
    if len(captured) != 1 or len(captured[0]) != len(ids):
        raise RuntimeError(f"expected one prefill of {len(ids)} rows, got {[len(c) for c in captured]}")
    rows = captured[0]
    # rows: the last position first, then positions 0..n-2 (step_inputs.py)
    logits = torch.cat([rows[1:], rows[:1]]).numpy()
    np.save(out, logits)
    return {"dtype": str(llm.llm_engine.model_config.dtype).removeprefix("torch.")}


def child_llama(path: str, ids: list[int], out: Path, threads: int) -> dict:
    import llama_cpp
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=max(len(ids), 64), n_batch=len(ids), n_ubatch=len(ids), n_threads=threads,
                n_threads_batch=threads, logits_all=True, verbose=False)  # fmt: skip
    llm.eval(ids)
    np.save(out, np.array(llm.scores[: len(ids)], dtype=np.float32))
    return {"dtype": f"llama-cpp-python {llama_cpp.__version__}"}


def spawn(engine: str, path: Path, ids_file: Path, out: Path, threads: int, llama_python: str) -> dict | None:
    python = llama_python if engine == "llama.cpp" else sys.executable
    cmd = [python, __file__, "--child", engine, "--ids", str(ids_file), "--out", str(out), "--threads", str(threads),
           str(path)]  # fmt: skip
    env = {"WSLM_CPU_COMPILE": "0", **os.environ, **ENGINES[engine], "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    print(f"{engine} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
    return None


def compare(a: np.ndarray, b: np.ndarray) -> dict:
    """a: the peer's logits (llama.cpp), b: wslm's, both [positions, vocab]."""
    vocab = min(a.shape[1], b.shape[1])
    a, b = a[:, :vocab].astype(np.float64), b[:, :vocab].astype(np.float64)
    d = np.abs(a - b)
    la = a - a.max(1, keepdims=True)
    la -= np.log(np.exp(la).sum(1, keepdims=True))
    lb = b - b.max(1, keepdims=True)
    lb -= np.log(np.exp(lb).sum(1, keepdims=True))
    return {"positions": len(a), "max_abs_diff": float(d.max()), "mean_abs_diff": float(d.mean()),
            "logit_std": float(a.std(axis=1).mean()), "top1": float((a.argmax(1) == b.argmax(1)).mean()),
            "kl": float((np.exp(la) * (la - lb)).sum(1).mean())}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*")
    p.add_argument("--tokens", type=int, nargs="*", default=[64, 63])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--llama-python", default="/work/llama-venv/bin/python")
    p.add_argument("--no-docs", action="store_true")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--ids", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        ids = json.loads(Path(args.ids).read_text())
        if args.child == "llama.cpp":
            r = child_llama(args.files[0], ids, Path(args.out), args.threads)
        else:
            import wslm  # noqa: F401  (before torch: wslm's OMP_WAIT_POLICY default must reach libgomp)

            r = child_wslm(args.files[0], ids, Path(args.out), args.threads)
        print("RESULT " + json.dumps(r), flush=True)
        return 0
    if not args.files:
        p.error("name at least one GGUF file")
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="wslm-logits-") as tmp:
        tmp = Path(tmp)
        for f in map(Path, args.files):
            for n in args.tokens:
                ids_file = tmp / f"ids{n}.json"
                ids_file.write_text(json.dumps(prompt_ids(n)))
                got = {}
                for engine in ENGINES:
                    out = tmp / f"{engine.replace(' ', '_')}.npy"
                    if spawn(engine, f.resolve(), ids_file, out, args.threads, args.llama_python) is not None:
                        got[engine] = np.load(out)
                key = f"{f.name}, {n} tokens"
                results[key] = {pair: compare(got[a], got[b]) for pair, (a, b) in {
                    "llama.cpp vs wslm blocks": ("llama.cpp", "wslm blocks"),
                    "llama.cpp vs wslm repacked": ("llama.cpp", "wslm repacked"),
                    "wslm repacked vs wslm blocks": ("wslm repacked", "wslm blocks")}.items()
                    if a in got and b in got}  # fmt: skip
                print(key, json.dumps(results[key]), flush=True)
    rows = ["| file, prompt | pair | max abs diff | mean abs diff | logits' std | top-1 agreement | KL (nats) |",
            "|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for key, pairs in results.items():
        for pair, c in pairs.items():
            rows.append(f"| {key} | {pair} | {c['max_abs_diff']:.4f} | {c['mean_abs_diff']:.5f} | {c['logit_std']:.3f} "
                        f"| {100 * c['top1']:.1f}% ({c['positions']}) | {max(c['kl'], 0):.2e} |")  # fmt: skip
    command = shlex.join(["bench/fidelity_logits.py", *sys.argv[1:]])
    body = (f"Logits of every position of a fixed prompt (bench/data/fidelity_text.md's first tokens), one prefill "
            f"per engine, {args.threads} thread(s); from 64 rows wslm runs its tiled block GEMM, below that its row "
            f"kernel (the one decode steps use). "
            f"Command: `.venv/bin/python {command}`.\n\n" + "\n".join(rows) + "\n")  # fmt: skip
    print(body)
    if args.no_docs:
        return 0
    sys.path.insert(0, str(BENCH))
    import datetime

    import machine

    now = datetime.datetime.now(datetime.timezone.utc)
    data = {"bench": "fidelity_logits", "date": now.strftime("%Y-%m-%d %H:%M UTC"), "machine": machine.describe(),
            "commit": machine.git_commit(), "threads": args.threads, "logits": results}  # fmt: skip
    out = machine.RESULTS / f"fidelity_logits-{now:%Y%m%d-%H%M%S}.json"
    out.write_text(json.dumps(data, indent=1) + "\n")
    print("written to", out)
    print("written to", machine.append_section("logits on a fixed prompt, wslm vs llama.cpp (bench/fidelity_logits.py)",
                                               body))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
