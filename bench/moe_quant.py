"""A Qwen3-MoE GGUF with quantized experts: resident memory and decode speed with the experts kept quantized
(int4 from Q4_0, int8 from Q8_0) against the same file dequantized at load (what wslm did before).

    .venv/bin/python bench/moe_quant.py [--out DIR] [--requests 8] [--max-tokens 32] [--no-write]

The model is bench/moe_vs_dense.py's random-weight tiny-qwen3-moe (8 layers, hidden 512, 8 experts of 768,
top-2), written here as GGUFs with gguf's writer and quantizers: experts in Q4_0 or Q8_0, every other
tensor F32. Each configuration loads in its own process (so resident memory is its own): RSS after load,
the experts' bytes, output tok/s at 1 stream and at --requests concurrent; the table goes to
docs/benchmarks-log.md."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # gguf_writer and the MoE tests' expert stacking

# (label, GGUF expert type, WSLM_GGUF_DEQUANTIZE)
CONFIGS = [("dequantized at load (before)", "Q4_0", "1"), ("Q4_0 experts kept int4", "Q4_0", "0"),
           ("Q8_0 experts kept int8", "Q8_0", "0")]  # fmt: skip


def write_ggufs(out: Path) -> tuple[Path, dict[str, Path]]:
    import transformers as tf
    from gguf_writer import write_gguf
    from moe_vs_dense import make_models
    from test_modeling_moe import _stacked_experts

    folder = make_models(out)["moe"]
    paths = {q: out / f"tiny-qwen3-moe-{q}.gguf" for q in ("Q4_0", "Q8_0")}
    if all(p.exists() for p in paths.values()):
        return folder, paths
    tensors = _stacked_experts(folder)  # llama.cpp's layout: one tensor per projection, experts stacked
    hf = tf.Qwen3MoeForCausalLM.from_pretrained(folder)  # its config for the writer
    for qtype, path in paths.items():
        write_gguf(path, hf, "qwen3moe", tensors=tensors, expert_type=qtype)
    return folder, paths


def child(path: str, tokenizer: str, requests: int, max_tokens: int) -> dict:
    from throughput import run_wslm

    from wslm.backend import LLM, SamplingParams

    llm = LLM(path, tokenizer=tokenizer, dtype="bfloat16", max_num_seqs=max(requests, 1))
    rss = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    experts = sum(layer.mlp.experts.nbytes for layer in llm.llm_engine.executor.runner.model.layers)
    llm.generate("warm up", SamplingParams(max_tokens=4))
    single = run_wslm(llm, 1, max_tokens)
    many = run_wslm(llm, requests, max_tokens)
    return {"rss": rss, "experts": experts, "single": single["tok_s"], "many": many["tok_s"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "wslm-bench-moe"))
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(*args.child, args.requests, args.max_tokens)))
        return 0
    import machine

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    folder, paths = write_ggufs(out)
    rows = ["| experts | file | experts resident | RSS after load | 1 stream tok/s | "
            f"{args.requests} concurrent tok/s |", "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    mb = 1 << 20
    for label, qtype, dequant in CONFIGS:
        env = dict(os.environ, WSLM_GGUF_DEQUANTIZE=dequant, WSLM_GGUF_CACHE="0")
        cmd = [sys.executable, __file__, "--child", str(paths[qtype]), str(folder), "--requests",
               str(args.requests), "--max-tokens", str(args.max_tokens)]  # fmt: skip
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        r = json.loads(proc.stdout.split("RESULT ", 1)[1])
        rows.append(f"| {label} | {paths[qtype].stat().st_size / mb:.0f} MiB | {r['experts'] / mb:.0f} MiB | "
                    f"{r['rss'] / mb:.0f} MiB | {r['single']:.1f} | {r['many']:.1f} |")
        print(rows[-1], flush=True)
    body = "\n".join(rows) + (
        f"\n\nMachine: {machine.describe()}. dtype bfloat16, {args.max_tokens} greedy tokens. RSS after load includes "
        "the F32 embedding / lm_head / attention tensors of the file (the same in every row) and the KV pool.\n"
    )
    print(body)
    if not args.no_write:
        machine.append_section("MoE GGUF experts kept quantized (bench/moe_quant.py)", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
