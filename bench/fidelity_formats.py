"""Fidelity per GGUF block format: the demo model in Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K_M, Q5_K_M and Q6_K,
each file run by wslm with its blocks in place (WSLM_GGUF_BLOCKS=1, the default), by wslm repacking it
(WSLM_GGUF_BLOCKS=0) and by llama.cpp, all scored against the same float32 reference.

    .venv/bin/python bench/fidelity_formats.py [--formats Q4_0 Q4_K_M ...] [--threads 1]
        [--llama-python /work/llama-venv/bin/python] [--limit-tokens N] [--no-docs]

(also `bench/fidelity.py --formats ...`, which hands over to this script.)

The files: the demo ships only as Q4_1, so its weights are dequantized once into an F32 GGUF (gguf-py, every
tensor, metadata copied), and llama.cpp's own quantizer (llama-cpp-python's llama_model_quantize, in its venv)
makes each format from that base, as a user's `llama-quantize` would. All cached in $WSLM_BENCH_CACHE or
~/.cache/wslm-bench/ (demo-F32.gguf, demo-Q4_0.gguf, ...). The demo's hidden size (576) is not a multiple of
256, so in the K-quant files llama.cpp stores the 576-column matrices in its fallback types (Q5_0 for Q4_K,
Q5_1 for Q5_K, Q8_0 for Q6_K) and only ffn_down (1536 columns) in K-quant blocks; the table names each file's
types (counted from the file).

Reference ("float32, unquantized"): transformers in float32 on the F32 base: the weights before quantization.
Second reference ("the file dequantized"): transformers in float32 on the quantized file itself: the exact
product of that file's weights, so KL to it is the engine's own arithmetic error (activation rounding, float
sums, KV precision) without the quantization error every engine shares.

Text, windows and scoring: bench/fidelity.py's (same token ids in every engine, each target scored once).
Engines in their own processes, --threads threads (1 by default: not a timing run). Writes
bench/results/fidelity_formats-DATE.json (after each file) and the table to docs/benchmarks-log.md (unless
--no-docs); docs/benchmarks.md's fidelity table is copied from it by hand."""

from __future__ import annotations

import argparse
import collections
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import fidelity  # noqa: E402  (bench/, beside this script)
import realsize_files  # noqa: E402

FORMATS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K_M", "Q5_K_M", "Q6_K")
# llama.cpp's llama_ftype numbers (include/llama.h)
FTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}
ENGINES = ("wslm blocks", "wslm repacked", "llama.cpp")
EXTRA_ENGINES = ("wslm blocks, float prefill", "wslm blocks, float32")  # only when named in --engines (bench/fidelity.py says what)


def demo_base(log=print) -> Path:
    """demo-F32.gguf: every tensor of the demo GGUF dequantized to float32 by gguf-py, metadata copied."""
    import gguf

    sys.path.insert(0, str(ROOT))
    from wslm.demo import demo_model_path

    out = realsize_files.cache_dir() / "demo-F32.gguf"
    if out.exists():
        return out
    src = demo_model_path()
    log(f"dequantizing {src.name} -> {out} ...")
    reader = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(out.with_suffix(".part"), str(reader.fields["general.architecture"].contents()))
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        kind = field.types[0]
        value = 0 if name == "general.file_type" else field.contents()  # LLAMA_FTYPE_ALL_F32
        w.add_key_value(name, value, kind, sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, data.reshape(tuple(int(d) for d in reversed(t.shape))))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out.with_suffix(".part").rename(out)
    return out


def format_file(quant: str, llama_python: str, log=print) -> Path:
    """demo-QUANT.gguf made from demo-F32.gguf by llama.cpp's quantizer (cached)."""
    base = demo_base(log)
    out = base.parent / f"demo-{quant}.gguf"
    if out.exists():
        return out
    if not Path(llama_python).exists():
        raise FileNotFoundError(f"{out} is missing and llama.cpp's quantizer needs llama-cpp-python: give "
                                "--llama-python a venv that has it.")  # fmt: skip
    log(f"quantizing {base.name} -> {out.name} with llama.cpp ...")
    tmp = out.with_suffix(".part")
    rc = subprocess.run([llama_python, "-c", realsize_files.QUANTIZE, str(base), str(tmp), str(FTYPES[quant]), "1"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode  # fmt: skip
    if rc != 0 or not tmp.exists():
        raise RuntimeError(f"llama.cpp's quantizer failed ({rc}) on {base} -> {quant}")
    tmp.rename(out)
    return out


def composition(path: Path) -> str:
    """The file's 2-D tensor types, most parameters first: 'Q5_0 62%, Q4_K 25%, ...'."""
    import gguf

    counts: collections.Counter = collections.Counter()
    for t in gguf.GGUFReader(path).tensors:
        if len(t.shape) >= 2:
            counts[t.tensor_type.name] += int(t.n_elements)
    total = sum(counts.values())
    return ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in counts.most_common())


def run_format(quant: str, args, ref_work: Path, log=print) -> dict:
    """One file: its own float32 reference, then the engines, each scored against both references."""
    path = format_file(quant, args.llama_python, log)
    out: dict = {"file": path.name, "types": composition(path), "bytes": path.stat().st_size, "engines": {}}
    with tempfile.TemporaryDirectory(prefix=f"wslm-fidelity-{quant}-") as tmp:
        own, work = Path(tmp) / "own", Path(tmp) / "work"
        own.mkdir()
        work.mkdir()
        fargs = argparse.Namespace(**{**vars(args), "model_path": str(path)})
        ref = fidelity.spawn("reference", fargs, own)
        if ref is None:
            raise RuntimeError(f"the float32 reference failed on {path}")
        if json.loads((own / "tokens.json").read_text())["tokens"] != json.loads(
                (ref_work / "tokens.json").read_text())["tokens"]:  # fmt: skip
            raise RuntimeError(f"{path.name}'s tokenizer gives other ids than the base's")
        out["dequantized"] = ref
        shutil.copy(ref_work / "tokens.json", work / "tokens.json")
        os.symlink(ref_work / "ref.npy", work / "ref.npy")  # KL / top-1 to the unquantized weights
        os.symlink(own / "ref.npy", work / "ref_file.npy")  # ... and to this file's exact product
        for name in args.engines:
            if name == "llama.cpp":
                r = fidelity.spawn(name, fargs, work, args.llama_python)
                if r is None:
                    r = fidelity.spawn(name, fargs, work, args.llama_python, no_extra_bufts=True)
            else:
                r = fidelity.spawn(name, fargs, work)
            log(f"{quant} {name}: {r}")
            out["engines"][name] = r
    return out


def table(results: dict, base: dict) -> tuple[str, list[str]]:
    rows = ["| file (types by parameters) | engine | perplexity | vs llama.cpp | KL vs float32 (nats) | "
            "top-1 vs float32 | KL vs the file dequantized | top-1 vs the file dequantized |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
            f"| demo-F32.gguf (float32, unquantized) | transformers float32 (reference) | {base['ppl']:.4f} | | 0 | "
            "100% | | |"]  # fmt: skip
    verdict = []
    for quant, res in results.items():
        label = f"{res['file']} ({res['types']})"
        d = res["dequantized"]
        rows.append(f"| {label} | transformers float32, the file dequantized | {d['ppl']:.4f} | | | | 0 | 100% |")
        lc = res["engines"].get("llama.cpp")
        for name, r in res["engines"].items():
            if not r:
                rows.append(f"| {label} | {name} | failed | | | | | |")
                continue
            vs = f"{100 * (r['ppl'] / lc['ppl'] - 1):+.2f}%" if lc else "-"
            rows.append(f"| {label} | {name} | {r['ppl']:.4f} | {vs} | {max(r['kl'], 0):.5f} | "
                        f"{100 * r['top1']:.2f}% | {max(r['kl_file'], 0):.5f} | {100 * r['top1_file']:.2f}% |")  # fmt: skip
        for name in [e for e in res["engines"] if e.startswith("wslm")]:
            r = res["engines"].get(name)
            if not (r and lc):
                continue
            ppl_ok = abs(r["ppl"] / lc["ppl"] - 1) <= 0.005
            kl_ok = r["kl"] <= lc["kl"]
            verdict.append(f"{quant}, {name}: perplexity within 0.5% of llama.cpp's {'met' if ppl_ok else 'NOT met'} "
                           f"({100 * (r['ppl'] / lc['ppl'] - 1):+.2f}%); KL vs float32 no larger "
                           f"{'met' if kl_ok else 'NOT met'} ({r['kl']:.5f} vs {lc['kl']:.5f}).")  # fmt: skip
    return "\n".join(rows), verdict


def save_json(results: dict, base: dict, args, tree: str, out: Path | None = None) -> Path:
    """bench/results/fidelity_formats-DATE.json: every figure of the run. Kept under "fidelity", not "records",
    so bench/summarize.py's speed table (wslm vs a peer, one value per metric) leaves it out."""
    import datetime

    import machine

    now = datetime.datetime.now(datetime.timezone.utc)
    data = {"bench": "fidelity_formats", "date": now.strftime("%Y-%m-%d %H:%M UTC"), "machine": machine.describe(),
            "commit": machine.git_commit(), "tree": tree, "threads": args.threads, "window": args.window,
            "stride": args.stride, "text": "bench/data/fidelity_text.md",
            "fidelity": {"reference": {"file": "demo-F32.gguf", **base}, "formats": results}}  # fmt: skip
    machine.RESULTS.mkdir(parents=True, exist_ok=True)
    out = out or machine.RESULTS / f"fidelity_formats-{now:%Y%m%d-%H%M%S}.json"
    out.write_text(json.dumps(data, indent=1) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--formats", nargs="*", default=list(FORMATS), help=f"any of {FORMATS} (default: all)")
    p.add_argument("--engines", nargs="*", default=list(ENGINES), help=f"any of {ENGINES + EXTRA_ENGINES}")
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--stride", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--llama-python", default="/work/llama-venv/bin/python")
    p.add_argument("--limit-tokens", type=int, default=0, help="score only the text's first N tokens (the table "
                   "says how many)")  # fmt: skip
    p.add_argument("--no-docs", action="store_true", help="print the table only")
    args = p.parse_args(argv)
    args.llama_no_extra_bufts = False
    bad = [f for f in args.formats if f not in FTYPES] + [e for e in args.engines if e not in ENGINES + EXTRA_ENGINES]
    if bad:
        p.error(f"unknown {bad}: formats are {FORMATS}, engines {ENGINES + EXTRA_ENGINES}")
    fidelity.windows(args.window + 1, args.window, args.stride)
    tree = fidelity._tree_state()
    base = demo_base()
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="wslm-fidelity-base-") as tmp:
        ref_work = Path(tmp)
        bargs = argparse.Namespace(**{**vars(args), "model_path": str(base)})
        ref = fidelity.spawn("reference", bargs, ref_work)
        if ref is None:
            return 1
        print("reference", ref, flush=True)
        saved = None
        for quant in args.formats:
            results[quant] = run_format(quant, args, ref_work)
            if not args.no_docs:  # after each file: a cut-off run keeps what it measured
                saved = save_json(results, ref, args, tree, saved)
        count = len(json.loads((ref_work / "tokens.json").read_text())["tokens"])
    rows, verdict = table(results, ref)
    if fidelity._tree_state() != tree:
        tree += ", CHANGED while this ran (rows may have measured different code)"
    command = shlex.join(["bench/fidelity_formats.py", *(sys.argv[1:] if argv is None else argv)])
    body = (f"The demo's weights (dequantized from its Q4_1 file to demo-F32.gguf) quantized by llama.cpp's own "
            f"quantizer into each format. Text: bench/data/fidelity_text.md ({count} tokens), {args.window}-token "
            f"windows every {args.stride} tokens, {ref['positions']} scored positions, the same token ids in every "
            f"engine, one window per forward (a 512-token prefill: wslm's tiled block GEMM or repacked GEMM, "
            f"llama.cpp's batched matmul). {args.threads} thread(s). wslm in its default dtype here (dtype=auto). "
            f"KL(reference || engine) over the full vocabulary, mean per position. Tree: {tree}. Command: "
            f"`.venv/bin/python {command}`.\n\n{rows}\n" + ("\n" + "\n".join(verdict) if verdict else ""))  # fmt: skip
    print(body)
    if args.no_docs:
        return 0
    import machine

    print("written to", save_json(results, ref, args, tree, saved))
    print("written to", machine.append_section("fidelity per GGUF block format (bench/fidelity_formats.py)", body))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
