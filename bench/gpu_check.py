"""GPU readiness in one run (a few minutes on an H100; the sections stop starting after 7): one table of

  1. every Triton kernel in wslm/kernels (paged attention: prefill, split-KV decode, mixed batches, window /
     soft cap / sinks, head_dim 80; KV-cache write; RMSNorm with and without the residual; rotary, neox and
     GPT-J; fused MoE; GGUF block GEMV/GEMM of every type) against its PyTorch reference on the same CUDA tensors: max abs error, PASS/FAIL
  2. the engine's greedy tokens against HF transformers on the demo model in float32 (as tests/test_engine_parity.py)
  3. CUDA graphs on vs off (enforce_eager): identical greedy tokens for a padded decode batch
  4. int4 decode GEMM and decode attention bandwidth as % of the card's peak (bench/kernels_gpu.py's benchmarks)

    .venv/bin/python bench/gpu_check.py --out gpu_check.md

Each section catches its own exception and reports FAIL with it, so one broken part hides nothing else.
Exit code 1 when any row failed. Without a CUDA device it says "no CUDA device: nothing to check" and exits 0."""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench"), str(REPO / "tests")]  # kernels_gpu, kernel_testing, wslm
NO_DEVICE = "no CUDA device: nothing to check"
DEVICE = "cuda"
BUDGET_S = 7 * 60  # sections not started by then are skipped: the whole run stays under 8 minutes
# Max abs error allowed, times max(1, |reference|): fp32 differs by summation order; half types by a rounding.
TOL = {"float32": 1e-4, "float16": 4e-3, "bfloat16": 3e-2}
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one short sentence."},
     {"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "user", "content": "Write a haiku about a lighthouse."}],
]  # fmt: skip

Row = tuple[str, str, str, str]  # section, check, result, status (PASS / FAIL / info / SKIP)


def compare(section: str, check: str, got, want, dtype: str) -> Row:
    err = float((got.float() - want.float()).abs().max()) if got.numel() else 0.0
    ref = float(want.float().abs().max()) if want.numel() else 0.0
    ok = got.shape == want.shape and err <= TOL[dtype] * max(1.0, ref)
    return section, f"{check} [{dtype}]", f"max abs err {err:.2e} (ref max {ref:.2g})", "PASS" if ok else "FAIL"


# --- 1. Triton kernels against the PyTorch references ---------------------------------------------------


def kernel_cases():
    """(name, dtype, fn) where fn() -> (triton result, torch result); inputs as tests/test_kernels_*.py make."""
    import torch
    from kernel_testing import make_paged_batch

    from wslm.kernels import fused_moe, paged_attention, reshape_and_cache, rms_norm, rotary_embedding

    dev = DEVICE

    def silu_and_mul(x):  # the activation tests/test_kernels_moe.py gives fused_moe
        gate, up = x.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up

    def attention(q_lens, kv_lens, heads, kv_heads, head_dim, dtype, **opts):
        def run():
            b = make_paged_batch(q_lens, kv_lens, heads, kv_heads, head_dim, 16, dtype=dtype, device=dev)
            args = (b.q, b.k_cache, b.v_cache, b.block_tables, b.cu_seqlens_q, b.seq_lens, head_dim**-0.5)
            return tuple(paged_attention(*args, backend=be, **opts) for be in ("triton", "torch"))

        return run

    def cache(dtype):
        def run():
            slots = torch.tensor([0, 17, -1, 5, 40, -1, 63, 200], device=dev)  # -1: padding, writes nothing
            kv = torch.randn(len(slots), 2, 8, 128, device=dev).to(dtype)  # a fused kv projection's slices
            out = []
            for be in ("triton", "torch"):
                k_cache = torch.zeros(16, 16, 8, 128, device=dev, dtype=dtype)
                v_cache = torch.zeros_like(k_cache)
                reshape_and_cache(kv[:, 0], kv[:, 1], k_cache, v_cache, slots, backend=be)
                out.append(torch.stack((k_cache, v_cache)))
            return tuple(out)

        return run

    def norm(dtype, residual):
        def run():
            x, r = (torch.randn(37, 4096, device=dev).to(dtype) for _ in range(2))
            w = (1 + 0.1 * torch.randn(4096, device=dev)).to(dtype)
            out = []
            for be in ("triton", "torch"):  # fresh copies: the fused form may update its inputs in place
                res = rms_norm(x.clone(), w, 1e-6, residual=r.clone() if residual else None, backend=be)
                out.append(torch.cat([t.flatten() for t in res]) if residual else res)  # normed | new residual
            return tuple(out)

        return run

    def rotary(dtype, neox, rot_dim):
        def run():
            heads, kv_heads, head_dim, tokens = 32, 8, 128, 29
            inv_freq = 1.0 / (10000 ** (torch.arange(0, rot_dim, 2).float() / rot_dim))
            freqs = torch.outer(torch.arange(4096).float(), inv_freq)
            cos_sin = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dev)
            pos = torch.randint(0, 4096, (tokens,), device=dev)
            qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device=dev).to(dtype)
            out = []
            for be in ("triton", "torch"):
                buf = qkv.clone()  # q and k as slices of the fused projection, rotated in place
                q, k = buf[:, : heads * head_dim], buf[:, heads * head_dim : (heads + kv_heads) * head_dim]
                rotary_embedding(pos, q, k, cos_sin, head_dim, is_neox_style=neox, backend=be)
                out.append(buf)
            return tuple(out)

        return run

    def moe(dtype, tokens):
        def run():
            g = torch.Generator().manual_seed(tokens)
            experts, top_k, hidden, inter = 8, 2, 1024, 512
            x = torch.randn(tokens, hidden, generator=g)
            w13 = torch.randn(experts, 2 * inter, hidden, generator=g) * hidden**-0.5
            w2 = torch.randn(experts, hidden, inter, generator=g) * inter**-0.5
            weights, ids = torch.topk(torch.randn(tokens, experts, generator=g).softmax(-1), top_k, dim=-1)
            args = [t.to(dev) for t in (x.to(dtype), w13.to(dtype), w2.to(dtype), (weights / weights.sum(-1,
                    keepdim=True)).to(dtype), ids)]  # fmt: skip
            return tuple(fused_moe(*args, silu_and_mul, backend=be) for be in ("triton", "torch"))

        return run

    def gguf(name, dtype, rows):
        def run():
            from kernel_testing import random_gguf_blocks

            raw = random_gguf_blocks(1000, 2048, name, seed=rows).to(dev)  # 1000 outputs: partial tiles
            x = torch.randn(rows, 2048, generator=torch.Generator().manual_seed(rows)).to(dtype).to(dev)
            return tuple(gguf_matmul(x, raw, name, backend=be) for be in ("triton", "torch"))

        return run

    from wslm.kernels import gguf_matmul
    from wslm.kernels.torch_gguf import FORMATS

    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    cases = []
    for fmt in FORMATS:  # GGUF blocks: the decode GEMV at 1 and 8 rows, the prefill GEMM at 300
        cases += [(f"GGUF {fmt} matmul, {rows} rows x [1000, 2048]", str(dtype)[6:], gguf(fmt, dtype, rows))
                  for dtype, rows in ((bf16, 1), (bf16, 8), (bf16, 300), (f32, 8), (f16, 300))]
    for dtype in (f32, bf16, f16):
        name = str(dtype)[6:]
        cases += [
            ("paged attention, mixed batch (prefill, decode, cached prefix), GQA 32/8, D128", name,
             attention([1, 37, 1, 250, 9], [700, 37, 1, 250, 300], 32, 8, 128, dtype)),
            ("paged attention, split-KV decode, 8 seqs up to 4k ctx", name,
             attention([1] * 8, [4000, 1, 17, 513, 2049, 64, 129, 3000], 32, 8, 128, dtype)),
            ("KV-cache write (reshape_and_cache), padding slots", name, cache(dtype)),
            ("RMSNorm [37, 4096]", name, norm(dtype, False)),
            ("RMSNorm fused with the residual add", name, norm(dtype, True)),
            ("rotary, neox, full head", name, rotary(dtype, True, 128)),
            ("rotary, GPT-J, partial (64 of 128)", name, rotary(dtype, False, 64)),
        ]  # fmt: skip
        if dtype != f16:
            cases += [(f"fused MoE, 8 experts top-2, {t} tokens", name, moe(dtype, t)) for t in (1, 300)]
    cases += [
        ("paged attention, window 64 + soft cap 30 + sinks, mixed", "float32",
         attention([1, 7, 150], [90, 7, 400], 8, 2, 64, f32, sliding_window=64, logits_soft_cap=30.0,
                   sinks=torch.linspace(-1, 2, 8, device=dev))),
        ("paged attention, decode, window 100 + sinks", "bfloat16",
         attention([1] * 4, [3000, 50, 101, 777], 8, 2, 64, bf16, sliding_window=100,
                   sinks=torch.linspace(-1, 2, 8, device=dev))),
        ("paged attention, head_dim 80, 3 heads per KV head", "float32", attention([1, 5], [20, 11], 6, 2, 80, f32)),
    ]  # fmt: skip
    return cases


def check_kernels(args) -> list[Row]:
    import torch

    rows = []
    for name, dtype, fn in kernel_cases():
        try:
            torch.manual_seed(0)
            got, want = fn()
            torch.cuda.synchronize()
            rows.append(compare("Triton kernels", name, got, want, dtype))
        except Exception as exc:  # one kernel failing must not hide the others
            traceback.print_exc()
            rows.append(("Triton kernels", f"{name} [{dtype}]", _error(exc), "FAIL"))
        print(f"  {rows[-1][1]}: {rows[-1][2]} {rows[-1][3]}", flush=True)
    return rows


# --- 2 and 3. The engine: HF parity, CUDA graphs on vs off ---------------------------------------------


def _engine(enforce_eager: bool):
    from wslm.backend import LLM

    return LLM("demo", dtype="float32", device=DEVICE, enforce_eager=enforce_eager, max_model_len=1024,
               max_num_seqs=8, num_gpu_blocks_override=512)  # fmt: skip


def _greedy(llm, prompts: list[list[int]], max_tokens: int, ignore_eos: bool = False) -> list[list[int]]:
    from wslm.backend import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=ignore_eos)
    return [list(o.outputs[0].token_ids) for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def check_parity(args) -> list[Row]:
    """The engine (CUDA graphs on, its default) against HF transformers' generate on the CPU, both float32."""
    import torch
    from engine_helpers import hf_greedy
    from kernels_gpu import _hf_model

    llm = _engine(enforce_eager=False)
    tok = llm.get_tokenizer()
    prompts = [llm.llm_engine.apply_chat_template(c) for c in CHATS]
    got = _greedy(llm, prompts, 32)
    del llm
    _free()
    hf = _hf_model("demo", torch.float32, torch.device("cpu"))
    rows = []
    for i, (prompt, tokens) in enumerate(zip(prompts, got, strict=True)):
        want = hf_greedy(hf, tok, prompt, 32)
        same = tokens == want
        result = f"{len(tokens)} tokens identical" if same else (
            f"differs from token {_first_difference(tokens, want)}: {tok.decode(tokens)!r} vs {tok.decode(want)!r}")
        rows.append(("engine vs HF (demo, float32)", f"greedy, chat {i + 1}", result, "PASS" if same else "FAIL"))
    return rows


def check_graphs(args) -> list[Row]:
    """5 prompts of different lengths (the batch is padded to the graph for 8), 48 tokens each."""
    from engine_helpers import demo_tokenizer

    tok = demo_tokenizer()
    prompts = [tok.encode(f"Request {i}: " + "the lighthouse keeper counts waves " * (1 + 4 * i)) for i in range(5)]
    results, captured = {}, None
    for eager in (False, True):
        llm = _engine(enforce_eager=eager)
        if not eager:
            engine = llm.llm_engine
            runner = getattr(engine, "runner", None) or getattr(getattr(engine, "executor", None), "runner", None)
            graphs = getattr(runner, "graphs", None)
            captured = sorted(graphs.graphs) if graphs is not None else []
        results[eager] = _greedy(llm, prompts, 48, ignore_eos=True)
        del llm
        _free()
    if not captured:
        return [("CUDA graphs", "graphs on vs off", "no graph was captured (see the log above)", "FAIL")]
    diff = [i for i, (a, b) in enumerate(zip(results[False], results[True], strict=True)) if a != b]
    result = f"5 x 48 tokens identical; graphs for batch sizes {captured}" if not diff else (
        f"prompts {diff} differ, first at token {_first_difference(results[False][diff[0]], results[True][diff[0]])}")
    return [("CUDA graphs", "greedy tokens, graphs on vs enforce_eager", result, "FAIL" if diff else "PASS")]


# --- 4. Bandwidth: bench/kernels_gpu.py's benchmarks ----------------------------------------------------


def check_bandwidth(args) -> list[Row]:
    import torch
    from kernels_gpu import Timer, bench_decode, bench_int4, card_peaks

    device = torch.device("cuda", torch.cuda.current_device())
    peak_bw = args.peak_bw or card_peaks(torch.cuda.get_device_name(device))[0]
    peak = f"of {peak_bw:.0f} GB/s peak" if peak_bw else "(peak unknown: --peak-bw GBPS)"
    shapes = argparse.Namespace(smoke=False, heads=32, kv_heads=8, head_dim=128)  # an 8B model's attention
    timer = Timer(device, reps=20, warmup=5)
    rows: list[Row] = []
    for name, bench in (("int4 decode GEMM", bench_int4), ("decode attention", bench_decode)):
        found: list[tuple[str, str, str, str]] = []  # kernels_gpu's rows: name, configuration, GB/s, % of peak
        try:
            bench(shapes, device, torch.bfloat16, timer, peak_bw, found)
        except Exception as exc:  # keep the other benchmark's numbers
            traceback.print_exc()
            found.append((name, "", _error(exc), "FAIL"))
        for _, config, result, pct in found:
            rows.append((f"bandwidth: {name}", config, result if pct == "FAIL" else f"{pct} {peak}: {result}",
                         "FAIL" if pct == "FAIL" else "info"))  # fmt: skip
    return rows


# --- the run ------------------------------------------------------------------------------------------


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]


def _free() -> None:
    import torch

    gc.collect()
    torch.cuda.empty_cache()


def markdown(rows: list[Row], title: str) -> str:
    lines = [f"## {title}", "", "| Section | Check | Result | Status |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def cuda_device() -> str | None:
    """The CUDA device's name, or None (torch missing, a CPU build, or no GPU reachable)."""
    try:
        import torch
    except Exception:
        return None
    try:
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # a broken driver raises here rather than answering False
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="write the markdown table to this file")
    ap.add_argument("--peak-bw", type=float, default=None, help="peak memory bandwidth in GB/s (unlisted cards)")
    args = ap.parse_args()
    name = cuda_device()
    if name is None:
        print(f"gpu_check: {NO_DEVICE}")
        if args.out:
            Path(args.out).write_text(f"gpu_check: {NO_DEVICE}\n", encoding="utf-8")
        return 0
    os.environ.pop("TRITON_INTERPRET", None)  # compiled kernels, before the kernel modules import triton
    os.environ.setdefault("WSLM_GGUF_DEQUANTIZE", "1")  # the demo GGUF in float32, as transformers loads it
    import torch

    print(f"gpu_check: {name}, torch {torch.__version__}", flush=True)
    start = time.monotonic()
    rows: list[Row] = []
    sections = [("Triton kernels", check_kernels), ("engine vs HF (demo, float32)", check_parity),
                ("CUDA graphs", check_graphs), ("bandwidth", check_bandwidth)]  # fmt: skip
    for section, fn in sections:
        if time.monotonic() - start > BUDGET_S:
            rows.append((section, "not run", f"past the {BUDGET_S // 60}-minute budget", "SKIP"))
            continue
        print(f"{section}:", flush=True)
        t = time.monotonic()
        try:
            rows += fn(args)
        except Exception as exc:  # one broken section must not hide the others
            traceback.print_exc()
            rows.append((section, "section", _error(exc), "FAIL"))
        finally:
            _free()
        print(f"  ({time.monotonic() - t:.0f} s)", flush=True)
    failed = sum(r[3] == "FAIL" for r in rows)
    title = (f"bench/gpu_check.py on {name} ({time.strftime('%Y-%m-%d %H:%M')}, {time.monotonic() - start:.0f} s): "
             f"{'all passed' if not failed else f'{failed} FAILED'}")  # fmt: skip
    table = markdown(rows, title)
    print("\n" + table)
    if args.out:
        Path(args.out).write_text(table, encoding="utf-8")
        print(f"gpu_check: wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
