"""GPU benchmark of wslm's kernels and engine: one short script (a few minutes on an H100/H200).

Reports
  1. decode paged attention (split-KV Triton kernel): GB/s of K/V read and % of the card's peak bandwidth
  2. prefill paged attention (Triton): TFLOP/s, beside torch's dense flash SDPA on the same shapes
  2b. int4 weight-only GEMM at decode sizes (1/8/32 rows, tinygemm through Int4Weight): GB/s and % of peak
  2c. GGUF block matmuls (Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K read as the file stores them, wslm.kernels.gguf_matmul):
      one 3B and one 8B decoder layer at 1/8/32 rows (GB/s, % of peak, dense cuBLAS beside) and 512 rows
  3. end to end (if wslm.backend.LLM imports): engine output tok/s vs HF transformers' batched generate at
     64 concurrent requests, same model, same GPU, same dtype
prints a markdown table and appends it, with the device name, to docs/benchmarks-log.md.

    .venv/bin/python bench/kernels_gpu.py                 # everything, appends to docs/benchmarks-log.md
    .venv/bin/python bench/kernels_gpu.py --no-engine     # kernels only
    .venv/bin/python bench/kernels_gpu.py --smoke         # CPU, TRITON_INTERPRET=1, tiny shapes: checks
                                                          # that the script runs; records nothing

Needs a CUDA build of torch and triton. --peak-bw GBPS overrides the bandwidth table for unlisted cards."""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# (substring of torch.cuda.get_device_name, case-insensitive) -> peak memory bandwidth GB/s, dense
# fp16/bf16 tensor TFLOP/s with fp32 accumulation (None: unknown). First match wins: specific names first.
CARDS = [
    ("GH200", 4000, 989),
    ("H200", 4800, 989),
    ("H100 NVL", 3900, 835),
    ("H100 PCIe", 2000, 756),
    ("H100", 3350, 989),  # SXM ("NVIDIA H100 80GB HBM3")
    ("H800", 3350, 989),
    ("H20", 4000, 148),
    ("A100-SXM4-80GB", 2039, 312),
    ("A100 80GB PCIe", 1935, 312),
    ("A100", 1555, 312),
    ("L40S", 864, 362),
    ("L40", 864, 181),
    ("L4", 300, 121),
    ("A10G", 600, 70),
    ("A10", 600, 125),
    ("RTX 5090", 1792, 209),
    ("RTX 5080", 960, 113),
    ("RTX 4090", 1008, 165),
    ("RTX 4080", 717, 97),
    ("RTX 4070 Ti", 504, 80),
    ("RTX 4070", 504, 58),
    ("RTX 3090 Ti", 1008, 80),
    ("RTX 3090", 936, 71),
    ("RTX 3080", 760, 59),
    ("T4", 320, 65),
    ("V100", 900, 125),
]


def card_peaks(name: str) -> tuple[float | None, float | None]:
    low = name.lower()
    for key, bw, tflops in CARDS:
        if key.lower() in low:
            return float(bw), float(tflops)
    return None, None


class Timer:
    """Median wall time of fn in ms; on CUDA per-call events with the L2 cache flushed between calls."""

    def __init__(self, device, reps: int, warmup: int) -> None:
        import torch

        self.torch = torch
        self.cuda = device.type == "cuda"
        self.reps, self.warmup = reps, warmup
        # Larger than any L2 (H200: 50 MB), so every call reads K/V from HBM.
        self.flush = torch.empty(256 << 20, dtype=torch.int8, device=device) if self.cuda else None

    def __call__(self, fn) -> float:
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        if not self.cuda:
            times = []
            for _ in range(self.reps):
                t = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t) * 1e3)
            return statistics.median(times)
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
        for s, e in zip(starts, ends, strict=True):
            self.flush.zero_()
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))


def make_batch(q_lens, kv_lens, heads, kv_heads, head_dim, block_size, dtype, device):
    """Random paged batch built on the device (blocks in shuffled order, as a long-running pool has)."""
    import torch

    per_seq = [-(-s // block_size) for s in kv_lens]
    num_blocks = sum(per_seq)
    perm = torch.randperm(num_blocks, device=device).int()
    tables = torch.zeros(len(kv_lens), max(per_seq), dtype=torch.int32, device=device)
    used = 0
    for i, n in enumerate(per_seq):
        tables[i, :n] = perm[used : used + n]
        used += n
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.randn(shape, dtype=dtype, device=device)
    v_cache = torch.randn(shape, dtype=dtype, device=device)
    cu = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(q_lens).cumsum(0)
    q = torch.randn(int(cu[-1]), heads, head_dim, dtype=dtype, device=device)
    seq_lens = torch.tensor(kv_lens, dtype=torch.int32, device=device)
    return q, k_cache, v_cache, tables, cu.to(device), seq_lens


def bench_decode(args, device, dtype, timer, peak_bw, rows) -> None:
    from wslm.kernels import paged_attention

    heads, kv_heads, head_dim, block = args.heads, args.kv_heads, args.head_dim, 16
    configs = [(1, 32768), (8, 8192), (32, 4096), (64, 2048), (128, 2048), (256, 1024)]
    if args.smoke:
        configs, heads, kv_heads, head_dim = [(2, 300), (4, 40)], 4, 2, 64
    for num_seqs, seq_len in configs:
        # Ragged lengths around seq_len (not block multiples), as a real decode batch has.
        lens = [max(1, seq_len - (i * 37) % max(1, seq_len // 4)) for i in range(num_seqs)]
        q, kc, vc, bt, cu, sl = make_batch([1] * num_seqs, lens, heads, kv_heads, head_dim, block, dtype, device)
        out = q.new_empty(q.shape)
        max_len = max(lens)

        def run(backend, q=q, kc=kc, vc=vc, bt=bt, cu=cu, sl=sl, out=out, max_len=max_len):
            paged_attention(q, kc, vc, bt, cu, sl, head_dim**-0.5, out=out, backend=backend,
                            max_seqlen_q=1, max_seqlen_k=max_len)

        ms = timer(lambda run=run: run("triton"))
        ref_ms = timer(lambda run=run: run("torch")) if num_seqs * max_len <= 64 * 2048 else None
        kv_bytes = 2 * sum(lens) * kv_heads * head_dim * kc.element_size()
        io_bytes = 2 * q.numel() * q.element_size() + bt.numel() * 4
        gbps = (kv_bytes + io_bytes) / (ms * 1e-3) / 1e9
        pct = f"{100 * gbps / peak_bw:.0f}%" if peak_bw else "n/a"
        ref = f"; torch ref {ref_ms:.3f} ms" if ref_ms is not None else ""
        rows.append((
            "decode attention",
            f"{num_seqs} seqs x ~{seq_len} ctx, H{heads}/KV{kv_heads}, D{head_dim}, bs{block}",
            f"{gbps:.0f} GB/s ({ms:.3f} ms{ref})", pct,
        ))  # fmt: skip
        print(f"  decode {num_seqs}x{seq_len}: {ms:.3f} ms, {gbps:.0f} GB/s, {pct} of peak{ref}", flush=True)
        del q, kc, vc, bt, out


def bench_int4(args, device, dtype, timer, peak_bw, rows) -> None:
    """The int4 weight-only GEMM at decode sizes (Int4Weight.apply: tinygemm's _weight_int4pack_mm on CUDA):
    GB/s of weight + scales read, against the card's peak (issue 12's target: >= 70% at one row)."""
    import torch

    from wslm.backend.quant.int4 import Int4Codes

    shapes = [(4096, 4096), (28672, 4096), (4096, 14336)]  # an 8B model's q|k|v-sized, gate|up, down
    rows_m = [1, 8, 32]
    group = 128
    if args.smoke:
        shapes, rows_m = [(256, 256)], [1, 4]
    for n, k in shapes:
        gen = torch.Generator().manual_seed(n + k)
        codes = Int4Codes(torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen),
                          torch.rand(n, k // group, generator=gen) * 0.02,
                          torch.randn(n, k // group, generator=gen) * 0.02, group)  # fmt: skip
        w = codes.pack(device)
        w_bytes = w.packed.numel() * w.packed.element_size() + w.scales_and_zeros.numel() * 2
        for m in rows_m:
            x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
            ms = timer(lambda w=w, x=x: w.apply(x))
            gbps = (w_bytes + 2 * m * (n + k)) / (ms * 1e-3) / 1e9
            pct = f"{100 * gbps / peak_bw:.0f}%" if peak_bw else "n/a"
            rows.append(("int4 decode GEMM", f"{m} rows x [{n}, {k}], group {group}", f"{gbps:.0f} GB/s ({ms:.3f} ms)",
                         pct))  # fmt: skip
            print(f"  int4 {m}x[{n},{k}]: {ms:.3f} ms, {gbps:.0f} GB/s, {pct} of peak", flush=True)
        del w


# One decoder layer's projections [out, in]: q|k|v, o, gate|up, down (Llama-3.2-3B and Llama-3.1-8B shapes).
GGUF_LAYERS = {
    "3B": [(5120, 3072), (3072, 3072), (16384, 3072), (3072, 8192)],
    "8B": [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)],
}


def _gguf_weight(name: str, n: int, k: int, device):
    """Random block bytes of GGUF type `name` made on the device (quant bytes uniform, f16 scales ~0.01)."""
    import torch
    from kernel_testing import GGUF_HALF_FIELDS

    from wslm.kernels.torch_gguf import FORMATS

    fmt = FORMATS[name]
    nb = k // fmt.block_weights
    raw = torch.randint(0, 256, (n, nb, fmt.block_bytes), dtype=torch.uint8, device=device)
    for at in GGUF_HALF_FIELDS[name]:
        half = (torch.rand(n, nb, device=device) * 0.02 + 1e-4).to(torch.float16)
        raw[..., at:at + 2] = half.view(torch.uint8).view(n, nb, 2)
    return raw.view(n, nb * fmt.block_bytes)


def bench_gguf(args, device, dtype, timer, peak_bw, rows) -> None:
    """GGUF block matmuls (wslm.kernels.gguf_matmul, Triton) on one decoder layer of a 3B and an 8B model
    per block type: 1 / 8 / 32 activation rows (the decode GEMV), GB/s of weight bytes read (the file's
    own bytes) and % of the card's peak, beside a dense 16-bit matmul (cuBLAS) of the same layer; and a
    512-row prefill GEMM on the layer, TFLOP/s."""
    import torch

    from wslm.kernels import gguf_matmul
    from wslm.kernels.torch_gguf import FORMATS

    sys.path.insert(0, str(REPO / "tests"))
    layers, rows_m, prefill = GGUF_LAYERS, [1, 8, 32], 512
    if args.smoke:
        layers, rows_m, prefill = {"tiny": [(48, 512), (32, 256)]}, [1, 4], 40
    peak_tflops = card_peaks(torch.cuda.get_device_name(device))[1] if device.type == "cuda" else None
    for name in FORMATS:
        for model, shapes in layers.items():
            weights = [_gguf_weight(name, n, k, device) for n, k in shapes]
            dense = [torch.randn(n, k, dtype=dtype, device=device) for n, k in shapes] if device.type == "cuda" else []
            w_bytes = sum(w.numel() for w in weights)
            for m in rows_m:
                xs = [torch.randn(m, k, dtype=dtype, device=device) for _, k in shapes]

                def layer(xs=xs, weights=weights, name=name):
                    for x, w in zip(xs, weights, strict=True):
                        gguf_matmul(x, w, name, backend="triton")

                ms = timer(layer)
                gbps = (w_bytes + sum(x.numel() * x.element_size() for x in xs)) / (ms * 1e-3) / 1e9
                pct = f"{100 * gbps / peak_bw:.0f}%" if peak_bw else "n/a"
                note = ""
                if dense:
                    dense_ms = timer(lambda xs=xs, dense=dense: [x @ w.t() for x, w in zip(xs, dense, strict=True)])
                    note = f"; dense {str(dtype)[6:]} {dense_ms:.3f} ms"
                rows.append((f"GGUF {name} GEMV", f"{m} rows x {model} layer ({w_bytes / 1e6:.0f} MB of blocks)",
                             f"{gbps:.0f} GB/s ({ms:.3f} ms{note})", pct))  # fmt: skip
                print(f"  {name} {model} {m} rows: {ms:.3f} ms, {gbps:.0f} GB/s, {pct} of peak{note}", flush=True)
            xs = [torch.randn(prefill, k, dtype=dtype, device=device) for _, k in shapes]
            ms = timer(lambda xs=xs, weights=weights, name=name: [
                gguf_matmul(x, w, name, backend="triton") for x, w in zip(xs, weights, strict=True)])
            tflops = 2 * prefill * sum(n * k for n, k in shapes) / (ms * 1e-3) / 1e12
            pct = f"{100 * tflops / peak_tflops:.0f}%" if peak_tflops else "n/a"
            rows.append((f"GGUF {name} GEMM", f"{prefill} rows x {model} layer", f"{tflops:.1f} TFLOP/s ({ms:.3f} ms)",
                         pct))  # fmt: skip
            print(f"  {name} {model} prefill {prefill}: {ms:.3f} ms, {tflops:.1f} TFLOP/s", flush=True)
            del weights, dense, xs


def bench_prefill(args, device, dtype, timer, peak_tflops, rows) -> None:
    import torch
    import torch.nn.functional as F

    from wslm.kernels import paged_attention

    heads, kv_heads, head_dim, block = args.heads, args.kv_heads, args.head_dim, 16
    # (query lengths, cached-prefix lengths)
    configs = [([4096], [0]), ([2048] * 4, [0] * 4), ([512] * 16, [0] * 16), ([512] * 8, [1536] * 8)]
    if args.smoke:
        configs, heads, kv_heads, head_dim = [([40, 17], [0, 0]), ([9], [30])], 4, 2, 64
    for q_lens, ctx in configs:
        kv_lens = [q + c for q, c in zip(q_lens, ctx, strict=True)]
        q, kc, vc, bt, cu, sl = make_batch(q_lens, kv_lens, heads, kv_heads, head_dim, block, dtype, device)
        out = q.new_empty(q.shape)
        pairs = sum(L * c + L * (L + 1) // 2 for L, c in zip(q_lens, ctx, strict=True))
        flops = 4 * pairs * head_dim * heads

        def run(q=q, kc=kc, vc=vc, bt=bt, cu=cu, sl=sl, out=out, mq=max(q_lens), mk=max(kv_lens)):
            paged_attention(q, kc, vc, bt, cu, sl, head_dim**-0.5, out=out, backend="triton",
                            max_seqlen_q=mq, max_seqlen_k=mk)

        ms = timer(run)
        tflops = flops / (ms * 1e-3) / 1e12
        note = ""
        if not any(ctx) and device.type == "cuda":
            # torch's fused SDPA on dense, contiguous tensors of the same shapes, for scale
            L, n = q_lens[0], len(q_lens)
            qd = torch.randn(n, heads, L, head_dim, dtype=dtype, device=device)
            kd = torch.randn(n, heads, L, head_dim, dtype=dtype, device=device)
            vd = torch.randn_like(kd)
            sdpa_ms = timer(lambda qd=qd, kd=kd, vd=vd: F.scaled_dot_product_attention(qd, kd, vd, is_causal=True))
            note = f"; torch SDPA dense {flops / (sdpa_ms * 1e-3) / 1e12:.0f} TFLOP/s"
            del qd, kd, vd
        pct = f"{100 * tflops / peak_tflops:.0f}%" if peak_tflops else "n/a"
        desc = f"{len(q_lens)} x {q_lens[0]} new" + (f" on {ctx[0]} cached" if any(ctx) else "")
        rows.append((
            "prefill attention", f"{desc}, H{heads}/KV{kv_heads}, D{head_dim}, causal",
            f"{tflops:.1f} TFLOP/s ({ms:.3f} ms{note})", pct,
        ))  # fmt: skip
        print(f"  prefill {desc}: {ms:.3f} ms, {tflops:.1f} TFLOP/s{note}", flush=True)
        del q, kc, vc, bt, out


def _hf_model(model: str, dtype, device):
    from transformers import AutoModelForCausalLM

    from wslm.backend.loader.model_loader import resolve_model

    src = resolve_model(model)
    kw = {"gguf_file": src.gguf_file} if src.gguf_file else {}
    # .to(dtype) rather than a from_pretrained argument, whose name differs across transformers versions
    return AutoModelForCausalLM.from_pretrained(str(src.folder), **kw).to(device=device, dtype=dtype).eval()


def bench_engine(args, device, rows) -> None:
    import torch

    try:
        from wslm.backend import LLM, SamplingParams
    except Exception as exc:  # the engine is optional here
        print(f"  engine: skipped, wslm.backend.LLM does not import ({exc})")
        rows.append(("engine vs HF", "skipped", f"wslm.backend.LLM does not import: {exc}", ""))
        return
    n, prompt_len, gen = args.requests, args.prompt_len, args.gen_len
    extra = {"device": "cpu", "kv_cache_memory": 64 << 20} if args.smoke else {
        "device": str(device), "gpu_memory_utilization": args.gpu_memory_utilization
    }  # fmt: skip
    llm = LLM(args.model, max_model_len=prompt_len + gen + 16, max_num_seqs=max(n, 8), **extra)
    engine = llm.llm_engine
    dtype = engine.model_config.dtype
    vocab = engine.model_config.vocab_size
    g = torch.Generator().manual_seed(0)
    # Distinct random prompts: prefix caching must not make the engine's prefill free.
    prompts = torch.randint(100, vocab - 100, (n, prompt_len), generator=g).tolist()
    params = SamplingParams(temperature=0, max_tokens=gen, ignore_eos=True)
    # Warm-up of the same shape (8 requests) compiles every kernel variant the timed run uses.
    llm.generate([{"prompt_token_ids": p} for p in prompts[:8]], params)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    if device.type == "cuda":
        torch.cuda.synchronize()
    engine_s = time.perf_counter() - t
    engine_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    engine_tps = engine_tokens / engine_s
    print(f"  engine: {engine_tokens} tokens in {engine_s:.2f} s = {engine_tps:.0f} tok/s", flush=True)
    del llm, engine, outs
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()

    hf_device = torch.device("cpu") if args.smoke else device
    hf = _hf_model(args.model, dtype, hf_device)
    ids = torch.tensor(prompts, device=hf_device)  # equal lengths: no padding needed
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0)
    with torch.no_grad():
        hf.generate(ids[:8], max_new_tokens=8, min_new_tokens=8, **kw)
        if hf_device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = hf.generate(ids, max_new_tokens=gen, min_new_tokens=gen, **kw)
        if hf_device.type == "cuda":
            torch.cuda.synchronize()
    hf_s = time.perf_counter() - t
    hf_tokens = (out.shape[1] - prompt_len) * n
    hf_tps = hf_tokens / hf_s
    print(f"  HF transformers: {hf_tokens} tokens in {hf_s:.2f} s = {hf_tps:.0f} tok/s", flush=True)
    del hf, out
    gc.collect()
    rows.append((
        "engine vs HF transformers",
        f"{args.model}, {n} concurrent requests, {prompt_len} prompt + {gen} output tokens, {str(dtype)[6:]}",
        f"{engine_tps:.0f} vs {hf_tps:.0f} output tok/s", f"{engine_tps / hf_tps:.1f}x",
    ))  # fmt: skip


def markdown(rows, device_name: str, versions: str) -> str:
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [
        f"## bench/kernels_gpu.py on {device_name} ({stamp})",
        "",
        versions,
        "",
        "| Benchmark | Configuration | Result | vs peak / baseline |",
        "|---|---|---|---|",
    ]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="CPU + Triton interpreter, tiny shapes, no record")
    ap.add_argument("--no-engine", action="store_true", help="skip the engine vs HF comparison")
    ap.add_argument("--model", default="demo", help="model for the end-to-end part (default: demo)")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--gen-len", type=int, default=256)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"], help="kernel benchmarks")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--peak-bw", type=float, default=None, help="peak memory bandwidth in GB/s")
    ap.add_argument("--output", default=str(REPO / "docs" / "benchmarks-log.md"), help="markdown file to append to")
    args = ap.parse_args()

    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel modules import triton
        args.requests, args.prompt_len, args.gen_len = 4, 20, 4
    try:
        import torch
    except ImportError:
        print("kernels_gpu: torch is not installed. Run ./setup.sh (with WSLM_TORCH_SPEC for a CUDA build).")
        return 2
    try:
        import triton
    except ImportError:
        print("kernels_gpu: triton is not installed (pip install triton; Linux only). Nothing to measure.")
        return 2
    if args.smoke:
        device, dtype = torch.device("cpu"), torch.float32
        device_name = "CPU (smoke run, TRITON_INTERPRET=1)"
    else:
        if not torch.cuda.is_available():
            print(
                f"kernels_gpu: torch {torch.__version__} sees no CUDA GPU, so there is nothing to measure. "
                "Run it on an NVIDIA machine with a CUDA build of torch (check `nvidia-smi` and "
                "`python -c 'import torch; print(torch.cuda.is_available())'`), or use --smoke here."
            )
            return 2
        device = torch.device("cuda", torch.cuda.current_device())
        dtype = getattr(torch, args.dtype)
        device_name = torch.cuda.get_device_name(device)
        os.environ.pop("TRITON_INTERPRET", None)
    peak_bw, peak_tflops = card_peaks(device_name)
    if args.peak_bw:
        peak_bw = args.peak_bw
    print(f"kernels_gpu: {device_name}; peak {peak_bw or '?'} GB/s, {peak_tflops or '?'} TFLOP/s (table)")
    versions = f"torch {torch.__version__}, triton {triton.__version__}, kernels in {str(dtype)[6:]}"
    if not args.smoke and peak_bw is None:
        print("  (card not in the table: pass --peak-bw GBPS for a % of peak)")

    timer = Timer(device, reps=3 if args.smoke else 20, warmup=1 if args.smoke else 5)
    rows: list[tuple[str, str, str, str]] = []
    start = time.perf_counter()
    for name, part in (("decode attention", bench_decode), ("prefill attention", bench_prefill),
                       ("int4 decode GEMM", bench_int4), ("GGUF block matmuls", bench_gguf)):  # fmt: skip
        print(f"{name}:", flush=True)
        try:
            part(args, device, dtype, timer, peak_tflops if name.startswith("prefill") else peak_bw, rows)
        except Exception as exc:  # keep the other parts' numbers
            traceback.print_exc()
            rows.append((name, "FAILED", f"{type(exc).__name__}: {exc}", ""))
    del timer
    if not args.no_engine:
        print("end to end:", flush=True)
        try:
            bench_engine(args, device, rows)
        except Exception as exc:
            traceback.print_exc()
            rows.append(("engine vs HF transformers", "FAILED", f"{type(exc).__name__}: {exc}", ""))
    table = markdown(rows, device_name, versions + f"; {time.perf_counter() - start:.0f} s in all")
    print()
    print(table)
    if args.smoke:
        print("kernels_gpu: smoke run, nothing recorded")
        return 0
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    head = "" if out.exists() else "# Benchmarks\n\nFigures from the scripts in bench/, with the machine they ran on.\n"
    with out.open("a", encoding="utf-8") as f:
        f.write(head + "\n" + table)
    print(f"kernels_gpu: appended to {out}")
    return 0 if all(r[1] != "FAILED" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
