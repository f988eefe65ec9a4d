"""LoRA adapters per request: offline throughput with 4 adapters mixed in every batch against the base alone,
on one engine (the demo model by default: its GGUF kept quantized, the adapters beside it).

    .venv/bin/python bench/lora.py [--model demo|PATH] [--requests 16] [--max-tokens 32] [--rank 16] [--no-write]

Random PEFT adapters on all seven projections are written for the model's shapes. The same prompts run
twice more after a warm-up: every request on the base, then round-robin over the 4 adapters (so each step
mixes all 4). Reports output tok/s of both, their ratio (target >= 0.8x), the adapters' memory beside the
base's, and the machine's load average (the numbers are only comparable on a quiet machine)."""

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

NAMES = {("self_attn", "qkv_proj"): ("q_proj", "k_proj", "v_proj"), ("self_attn", "o_proj"): ("o_proj",),
         ("mlp", "gate_up_proj"): ("gate_proj", "up_proj"), ("mlp", "down_proj"): ("down_proj",)}


def write_adapters(model, folder: Path, count: int, rank: int, targets: set[str] | None = None) -> list[Path]:
    """count PEFT folders with random A/B (std 0.02) on the targets (None: every projection) of model's layers."""
    import torch
    from safetensors.torch import save_file

    from wslm.backend.lora.weights import base_layers

    out = []
    for k in range(count):
        gen = torch.Generator().manual_seed(k)
        tensors = {}
        for (i, block, name), linear in base_layers(model).items():
            for part, rows in zip(NAMES[(block, name)], linear.output_sizes):
                if targets is not None and part not in targets:
                    continue
                key = f"base_model.model.model.layers.{i}.{block}.{part}"
                tensors[f"{key}.lora_A.weight"] = torch.randn(rank, linear.input_size, generator=gen) * 0.02
                tensors[f"{key}.lora_B.weight"] = torch.randn(rows, rank, generator=gen) * 0.02
        path = folder / f"adapter{k}"
        path.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(path / "adapter_model.safetensors"))
        (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": rank}))
        out.append(path)
    return out


def timed(llm, prompts, params, loras) -> tuple[float, float, int]:
    """(wall seconds, this process's CPU seconds, output tokens): CPU time moves less with the machine's load."""
    start, cpu = time.perf_counter(), time.process_time()
    outs = llm.generate(prompts, params, lora_request=loras)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return wall, cpu, sum(len(o.outputs[0].token_ids) for o in outs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--targets", default="all",
                    help="all (the seven projections) or a comma list, e.g. q_proj,v_proj (PEFT's Llama default)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--no-write", action="store_true", help="print only, leave docs/benchmarks-log.md alone")
    args = ap.parse_args()

    from wslm.backend import LLM, LoRARequest, SamplingParams
    from wslm.backend.modeling.weight_bytes import weight_bytes

    llm = LLM(args.model, enable_lora=True, max_loras=4, max_lora_rank=max(16, args.rank),
              max_num_seqs=max(args.requests, 1), device=args.device)
    runner = llm.llm_engine.core.executor.runner
    tmp = Path(tempfile.mkdtemp(prefix="wslm-lora-bench-"))
    targets = None if args.targets == "all" else set(args.targets.split(","))
    loras = [LoRARequest(f"a{k}", k + 1, str(p)) for k, p in enumerate(write_adapters(runner.model, tmp, 4, args.rank, targets))]
    prompts = [f"Write a short story about topic number {i}." for i in range(args.requests)]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    mixed = [loras[i % 4] for i in range(args.requests)]
    load_before = os.getloadavg()
    timed(llm, prompts[:4], SamplingParams(max_tokens=4), loras)  # warm-up: the adapters become resident
    timed(llm, prompts[:4], SamplingParams(max_tokens=4), None)
    base_wall, base_cpu, base_tokens = timed(llm, prompts, params, None)
    lora_wall, lora_cpu, lora_tokens = timed(llm, prompts, params, mixed)
    load_after = os.getloadavg()
    base_bytes = sum(weight_bytes(runner.model).values())
    lora_bytes = runner.lora.nbytes()
    base_tps, lora_tps = base_tokens / base_wall, lora_tokens / lora_wall
    rows = [
        "| run | output tok/s | tokens per CPU second |", "|---|---:|---:|",
        f"| base alone, {args.requests} concurrent, {args.max_tokens} tokens each | {base_tps:.1f} | "
        f"{base_tokens / base_cpu:.1f} |",
        f"| 4 adapters (rank {args.rank}, {args.targets}) mixed round-robin, same requests | {lora_tps:.1f} | "
        f"{lora_tokens / lora_cpu:.1f} |",
        "",
        f"Ratio mixed / base = {lora_tps / base_tps:.2f}x wall, {(lora_tokens / lora_cpu) / (base_tokens / base_cpu):.2f}x "
        "per CPU second (target >= 0.8x). Memory: base weights "
        f"{base_bytes / 1e6:.1f} MB, 4 adapters beside it {lora_bytes / 1e6:.1f} MB. Model {args.model} "
        f"({'16/32-bit' if not getattr(runner.model.cfg, 'quantization', None) else runner.model.cfg.quantization} "
        f"weights), device {runner.device}. Load average (1 min) {load_before[0]:.1f} before, {load_after[0]:.1f} after "
        f"on {os.cpu_count()} CPUs.",
    ]
    table = "\n".join(rows)
    print(table)
    if not args.no_write:
        print("written to", machine.append_section("LoRA adapters per request (bench/lora.py)", table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
