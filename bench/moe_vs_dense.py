"""A tiny Qwen3-MoE beside a tiny dense Qwen3 of the same active size, through the engine and HF transformers.

    .venv/bin/python bench/moe_vs_dense.py [--out DIR] [--requests 32] [--max-tokens 64] [--no-hf] [--no-write]

Both are random-weight models made here from the HF config classes with the demo tokenizer: 8 layers,
hidden 512, 8 query / 2 KV heads of 64; the dense MLP is 1536 wide, the MoE has 8 experts of 768 with top-2
routing (the same 1536 active MLP width per token, 4x the expert weights). The folders stay in --out, so
`bench/throughput.py --model DIR/tiny-qwen3-moe` can rerun either. Reports output tok/s at 1 stream and at
--requests concurrent (bench/throughput.py's runs), HF generate as one padded batch, and appends the table
to docs/benchmarks-log.md."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import machine  # noqa: E402
from throughput import run_hf, run_wslm  # noqa: E402

SHAPE = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
             max_position_embeddings=4096, tie_word_embeddings=False)  # fmt: skip


def make_models(out: Path) -> dict[str, Path]:
    """{"dense": folder, "moe": folder}, made once (kept in out for reruns)."""
    import torch
    import transformers as tf

    from wslm.demo import demo_model_path

    path = demo_model_path()
    tok = tf.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    common = dict(vocab_size=len(tok), eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, **SHAPE)
    made = {
        "dense": (out / "tiny-qwen3", lambda: tf.Qwen3ForCausalLM(tf.Qwen3Config(intermediate_size=1536, **common))),
        "moe": (out / "tiny-qwen3-moe", lambda: tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(
            intermediate_size=1536, moe_intermediate_size=768, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=True, **common))),
    }  # fmt: skip
    folders = {}
    for name, (folder, build) in made.items():
        if not (folder / "config.json").exists():
            torch.manual_seed(0)
            build().eval().save_pretrained(folder)
            tok.save_pretrained(folder)
        folders[name] = folder
    return folders


def count_params(folder: Path) -> tuple[int, int]:
    """(total, active per token) parameters, from the safetensors headers."""
    import json

    from safetensors import safe_open

    cfg = json.loads((folder / "config.json").read_text())
    total = expert = 0
    for file in folder.glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            for name in f.keys():
                n = f.get_slice(name).get_shape()
                size = 1
                for d in n:
                    size *= d
                total += size
                if ".experts." in name:
                    expert += size
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or 1  # transformers 5 renamed it
    active = total - expert + expert * cfg.get("num_experts_per_tok", 1) // experts
    return total, active


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="where the two model folders go (default: a temporary folder)")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--hf-batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; the best of each is kept")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--no-write", action="store_true", help="print only, leave docs/benchmarks-log.md alone")
    args = ap.parse_args()

    from wslm.backend import LLM, SamplingParams

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="wslm-moe-bench-"))
    folders = make_models(out)
    llms = {name: LLM(str(folder), max_num_seqs=max(args.requests, 1), dtype=args.dtype)
            for name, folder in folders.items()}  # fmt: skip
    best: dict[str, dict[str, float]] = {name: {} for name in folders}
    rounds: list[str] = []
    for _ in range(args.rounds):
        # Alternating, best of each: the machine may be shared, and a busy moment should not pick the winner.
        per_round = []
        for name, folder in folders.items():
            llms[name].generate("warm up", SamplingParams(max_tokens=4))
            got = {"single": run_wslm(llms[name], 1, 128)["tok_s"]}
            many = run_wslm(llms[name], args.requests, args.max_tokens)
            got.update(many=many["tok_s"], overhead=many["overhead"])
            if not args.no_hf:
                got["hf"] = run_hf(0, args.hf_batch, args.max_tokens, str(folder))["batch_tok_s"]
            for key, value in got.items():
                keep = min if key == "overhead" else max
                best[name][key] = keep(best[name].get(key, value), value)
            per_round.append(f"{got['single']:.1f}/{got['many']:.1f}")
            print(name, got, flush=True)
        rounds.append(" vs ".join(per_round))
    rows = [
        f"| model | params total / active | 1 stream, 128 tokens (tok/s) | {args.requests} concurrent, "
        f"{args.max_tokens} tokens each (tok/s) | step overhead at {args.requests} | HF padded batch of "
        f"{args.hf_batch} (tok/s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, folder in folders.items():
        total, active = count_params(folder)
        dtype = str(llms[name].llm_engine.model_config.dtype).removeprefix("torch.")
        b = best[name]
        hf = f"{b['hf']:.1f}" if "hf" in b else ""
        rows.append(f"| {folder.name} ({dtype}) | {total / 1e6:.1f}M / {active / 1e6:.1f}M | {b['single']:.1f} | "
                    f"{b['many']:.1f} | {b['overhead']:.1%} | {hf} |")  # fmt: skip
    rows.append(
        f"\nBest of {args.rounds} alternating rounds (dense vs MoE, 1 stream/{args.requests} concurrent tok/s per "
        f"round: {'; '.join(rounds)}). Random weights, ignore_eos chat requests, greedy. Both models have the same "
        "active MLP width per token; the MoE routes each token to 2 of 8 experts (kernels.fused_moe: tokens "
        "grouped by expert, one matmul per active expert). HF runs float32, its default."
    )
    table = "\n".join(rows)
    print(table)
    if not args.no_write:
        print("written to", machine.append_section("tiny MoE vs tiny dense (bench/moe_vs_dense.py)", table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
