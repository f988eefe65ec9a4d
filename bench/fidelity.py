"""How faithful each engine is to a GGUF file: perplexity, top-1 agreement and KL against a float32 reference.

    .venv/bin/python bench/fidelity.py [--model FILE.gguf] [--window 512] [--stride 256] [--threads 2]
        [--llama-python /work/llama-venv/bin/python] [--only ...] [--limit-tokens N] [--no-docs]
    .venv/bin/python bench/fidelity.py --formats [Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K_M Q5_K_M Q6_K] [--threads 1]
        (per block format: the demo quantized by llama.cpp into each, wslm blocks / repacked / llama.cpp;
        bench/fidelity_formats.py)

The text is bench/data/fidelity_text.md (English, Chinese and code, ~4.3k tokens with the demo tokenizer),
tokenized once by the reference child with the model's own tokenizer (transformers reading the GGUF, no
special tokens). Every engine gets the same token ids, never text, so tokenizers cannot differ. The ids are
cut into windows of --window tokens every --stride tokens; each window runs on its own as one sequence (a
fresh context, batch of one, in every engine), and it scores only the targets no earlier window scored (the
first window all of its own), so every token after the first is scored exactly once, from the same context,
in every engine.

Engines, each in its own process:
- reference: transformers' model dequantized to float32 (what `from_pretrained(gguf_file=...)` gives);
  its log-probabilities at the scored positions are written to a scratch .npy that the others read.
- wslm rows: `LLM(model=FILE)` with the GGUF kept quantized (the default) in the default dtype (dtype=auto:
  bfloat16 where the CPU has bf16 arithmetic, else float32; "wslm float32" is not run twice when they are
  the same), in float32, in bfloat16, and in float32 with WSLM_QUANT_FLOAT32=1 (int4/int8 weights
  multiplied in float32), plus wslm with the GGUF dequantized (WSLM_GGUF_DEQUANTIZE=1, float32): the
  harness check, which should sit on the reference.
- llama.cpp: llama-cpp-python (its own venv, no torch: it gets token ids and gives metrics as JSON) with
  logits_all=True, --threads threads, n_ctx = n_batch = the window.

Metrics per engine over the same positions: perplexity of the text, top-1 agreement (its argmax equals the
reference's), and mean KL(reference || engine) in nats, from the full-vocabulary distributions.

How wslm's full-vocabulary logits are read: the public way, `SamplingParams(prompt_logprobs=-1)` with
`max_logprobs=-1`, builds a dict of every vocabulary entry per prompt token and decodes each entry's text
(49k entries x 512 positions per window: minutes and gigabytes per window). So the bench asks the public API
for `prompt_logprobs=0` (which makes the engine compute a logits row at every prompt position, through
its scheduler and model runner as a user's request would), and keeps a copy of the logits the model
returns by wrapping the loaded model's `forward` (`llm.llm_engine.executor.runner.model`, the single-process
executor's; an internal hook, kept here and not in the package). It then checks that its log-probabilities
of the prompt's tokens equal the public `prompt_logprobs` values. Prompt steps run the model's own forward
(the CPU decode back ends serve only one-token steps), so these are the logits wslm samples from in a
prefill; the decode kernels (the C decode step, cpu_gemv's int4/int8 GEMV) are not measured here.
WSLM_CPU_COMPILE=0 unless set: the background decode compile would only take CPU from the others.

Appends the table to docs/benchmarks-log.md (unless --no-docs or --limit-tokens)."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TEXT = Path(__file__).resolve().parent / "data" / "fidelity_text.md"
# name: (dtype, environment); every wslm row keeps the GGUF quantized unless its environment says otherwise
WSLM_CONFIGS = {
    "wslm default": (None, {}),
    "wslm float32": ("float32", {}),
    "wslm bfloat16": ("bfloat16", {}),  # dtype=auto's choice on a CPU with bf16 arithmetic (AVX512-BF16, AMX)
    "wslm float32 + WSLM_QUANT_FLOAT32=1": ("float32", {"WSLM_QUANT_FLOAT32": "1"}),
    "wslm float32, GGUF dequantized": ("float32", {"WSLM_GGUF_DEQUANTIZE": "1"}),
    # bench/fidelity_formats.py's rows: the file's blocks in place (the default) and repacked
    "wslm blocks": (None, {"WSLM_GGUF_BLOCKS": "1"}),
    "wslm blocks, float32": ("float32", {"WSLM_GGUF_BLOCKS": "1"}),  # on a CPU where dtype=auto is bfloat16
    "wslm repacked": (None, {"WSLM_GGUF_BLOCKS": "0"}),
    # the blocks with the tiled int8 GEMM refused (run_wslm patches GGUFBlockWeight._gemm, here, not in the
    # package): a prefill multiplies dequantized slices in float, no activation rounding (an experiment)
    "wslm blocks, float prefill": (None, {"WSLM_GGUF_BLOCKS": "1"}),
}
ENGINES = ["reference", *list(WSLM_CONFIGS)[:5], "llama.cpp"]
REF_NAME = "transformers float32 (reference)"


# ---- pure parts (numpy only: the llama.cpp child, which has no torch, uses them too) ----


def load_text(path: Path = TEXT) -> str:
    """The benchmark text without its leading header comment (source and licence)."""
    return re.sub(r"\A<!--.*?-->\n", "", path.read_text(encoding="utf-8"), flags=re.S)


def windows(n: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(start, end, first) per window over n tokens: the window is ids[start:end] and it scores the targets
    ids[first:end] (each predicted from the position before it), so targets 1..n-1 are scored exactly once,
    each with as much context as its window holds."""
    if window < 2 or not 1 <= stride <= window - 1:
        raise ValueError(f"need window >= 2 and 1 <= stride < window, got window={window}, stride={stride}")
    out: list[tuple[int, int, int]] = []
    scored = 1  # the first token has nothing before it
    start = 0
    while scored < n:
        end = min(start + window, n)
        out.append((start, end, scored))
        scored = end
        start += stride  # start + window > scored: each later window reaches past what is scored
    return out


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


class Scores:
    """Accumulates one engine's perplexity, top-1 agreement and KL(reference || engine) over scored rows."""

    def __init__(self) -> None:
        self.n = 0
        self.nll = 0.0
        self.kl = 0.0
        self.agree = 0
        self.kl2 = 0.0  # against a second reference (bench/fidelity_formats.py: the file dequantized)
        self.agree2 = 0
        self.second = False

    def add(self, logprobs: np.ndarray, targets: np.ndarray, ref: np.ndarray | None = None,
            ref2: np.ndarray | None = None) -> None:  # fmt: skip
        """logprobs, ref, ref2: [rows, vocab] log-probabilities (engine's, reference's, an optional second
        reference's); targets: [rows] token ids."""
        logprobs = np.asarray(logprobs, dtype=np.float64)
        rows = np.arange(len(targets))
        self.n += len(targets)
        self.nll -= float(logprobs[rows, targets].sum())
        if ref is not None:
            kl, agree = self._versus(logprobs, ref)
            self.kl += kl
            self.agree += agree
        if ref2 is not None:
            kl, agree = self._versus(logprobs, ref2)
            self.kl2 += kl
            self.agree2 += agree
            self.second = True

    @staticmethod
    def _versus(logprobs: np.ndarray, ref: np.ndarray) -> tuple[float, int]:
        ref = np.asarray(ref, dtype=np.float64)
        return (float((np.exp(ref) * (ref - logprobs)).sum()),
                int((ref.argmax(axis=-1) == logprobs.argmax(axis=-1)).sum()))  # fmt: skip

    def result(self) -> dict:
        out = {"positions": self.n, "ppl": float(np.exp(self.nll / self.n)), "kl": self.kl / self.n,
               "top1": self.agree / self.n}  # fmt: skip
        if self.second:
            out.update(kl_file=self.kl2 / self.n, top1_file=self.agree2 / self.n)
        return out


def score_windows(spans, tokens: list[int], window_logits, ref_path: Path | None, vocab: int) -> dict:
    """window_logits(ids) -> logits [len(ids) - 1 or more, >= vocab] for the positions 0.. of one window. Scores
    every window against the reference log-probabilities at ref_path (rows in scored order), if given, and
    against ref_file.npy beside it where that exists (kl_file, top1_file)."""
    ref = np.load(ref_path, mmap_mode="r") if ref_path else None
    second = ref_path.with_name("ref_file.npy") if ref_path else None
    ref2 = np.load(second, mmap_mode="r") if second and second.exists() else None
    scores, row = Scores(), 0
    for start, end, first in spans:
        logits = window_logits(tokens[start:end])
        lo, hi = first - start - 1, end - start - 1  # positions whose next token is a scored target
        targets = np.asarray(tokens[first:end])
        for a in range(lo, hi, 128):  # in chunks: float64 rows of the whole vocabulary are large
            b = min(a + 128, hi)
            r = row + a - lo
            scores.add(log_softmax(np.asarray(logits[a:b])[:, :vocab]), targets[a - lo : b - lo],
                       None if ref is None else ref[r : r + b - a],
                       None if ref2 is None else ref2[r : r + b - a])  # fmt: skip
        row += hi - lo
    return scores.result()


# ---- the engines (each in its own process) ----


def run_reference(args, work: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(args.model_path)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tokens = tok(load_text(), add_special_tokens=False).input_ids
    if args.limit_tokens:
        tokens = tokens[: args.limit_tokens]
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.eval()
    vocab = model.config.vocab_size
    (work / "tokens.json").write_text(json.dumps({"tokens": tokens, "vocab": vocab}))
    spans = windows(len(tokens), args.window, args.stride)
    ref = np.lib.format.open_memmap(work / "ref.npy", mode="w+", dtype=np.float32,
                                    shape=(sum(end - first for _, end, first in spans), vocab))  # fmt: skip
    row, scores = 0, Scores()
    start_t = time.perf_counter()
    with torch.inference_mode():
        for start, end, first in spans:
            logits = model(torch.tensor([tokens[start:end]])).logits[0, first - start - 1 : end - start - 1]
            lp = torch.log_softmax(logits[:, :vocab].double(), -1)
            ref[row : row + len(lp)] = lp.float().numpy()
            scores.add(lp.numpy(), np.asarray(tokens[first:end]))  # its own perplexity, in float64
            row += len(lp)
    ref.flush()
    return {**scores.result(), "kl": 0.0, "top1": 1.0, "seconds": time.perf_counter() - start_t,
            "dtype": "float32 (dequantized)"}  # fmt: skip


def run_wslm(name: str, args, work: Path) -> dict:
    dtype, env = WSLM_CONFIGS[name]
    os.environ["WSLM_GGUF_DEQUANTIZE"] = env.get("WSLM_GGUF_DEQUANTIZE", "0")
    os.environ.update(env)
    import torch

    from wslm.backend import LLM, SamplingParams

    if name == "wslm blocks, float prefill":
        from wslm.backend.quant import gguf_blocks

        gguf_blocks.GGUFBlockWeight._gemm = lambda self: False  # many rows: gguf_blocks' _prefill path
    info = json.loads((work / "tokens.json").read_text())
    tokens, vocab = info["tokens"], info["vocab"]
    spans = windows(len(tokens), args.window, args.stride)
    kwargs = {"dtype": dtype} if dtype else {}
    llm = LLM(args.model_path, max_model_len=args.window + 1, max_num_seqs=1, kv_cache_memory=256 << 20,
              max_num_batched_tokens=max(2048, args.window), enable_prefix_caching=False, **kwargs)  # fmt: skip
    model = llm.llm_engine.executor.runner.model
    forward = model.forward
    captured: list[torch.Tensor] = []

    def capture(*a, **k):
        out = forward(*a, **k)
        captured.append(out.detach().float().clone())
        return out

    model.forward = capture  # the bench's hook (see the docstring): the logits the model returned
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    worst = 0.0
    seconds = 0.0

    def window_logits(ids):
        nonlocal worst, seconds
        captured.clear()
        t = time.perf_counter()
        out = llm.generate({"prompt_token_ids": ids}, params)[0]
        seconds += time.perf_counter() - t
        if len(captured) != 1 or len(captured[0]) != len(ids):
            raise RuntimeError(f"expected one prefill step of {len(ids)} logits rows, got "
                               f"{[len(c) for c in captured]}: chunked prefill? (--window vs the token budget)")  # fmt: skip
        # rows: the sampled row (the last position) first, then the prompt positions 0..n-2 (step_inputs.py)
        logits = captured[0][1:, :vocab]
        lp = torch.log_softmax(logits.double(), -1)
        mine = lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
        public = torch.tensor([out.prompt_logprobs[i + 1][t].logprob for i, t in enumerate(ids[1:])],
                              dtype=torch.float64)  # fmt: skip
        worst = max(worst, float((mine - public).abs().max()))
        return logits.numpy()

    result = score_windows(spans, tokens, window_logits, work / "ref.npy", vocab)
    if worst > 1e-3:
        raise RuntimeError(f"captured logits disagree with the public prompt_logprobs by {worst:.2g}")
    dt = str(llm.llm_engine.model_config.dtype).removeprefix("torch.")
    return {**result, "seconds": seconds, "dtype": dt, "hook_vs_public": worst}


def run_llama_cpp(args, work: Path) -> dict:
    if args.llama_no_extra_bufts:  # llama.cpp's repacked (AMX) weight buffers off: some builds crash in them
        import machine  # bench/, this script's folder (the llama.cpp venv has no wslm)

        machine.llama_cpp_without_repack()
    from llama_cpp import Llama

    info = json.loads((work / "tokens.json").read_text())
    tokens, vocab = info["tokens"], info["vocab"]
    spans = windows(len(tokens), args.window, args.stride)
    llm = Llama(model_path=args.model_path, n_ctx=args.window, n_batch=args.window, n_ubatch=args.window,
                n_threads=args.threads, n_threads_batch=args.threads, logits_all=True, verbose=False)  # fmt: skip
    if llm.n_vocab() < vocab:
        raise RuntimeError(
            f"llama.cpp's vocabulary ({llm.n_vocab()}) is smaller than the reference's ({vocab})"
        )
    seconds = 0.0

    def window_logits(ids):
        nonlocal seconds
        llm.reset()
        t = time.perf_counter()
        llm.eval(ids)
        seconds += time.perf_counter() - t
        return np.array(llm.scores[: len(ids) - 1, :vocab])

    result = score_windows(spans, tokens, window_logits, work / "ref.npy", vocab)
    import llama_cpp

    extra = " (no repack buffers)" if args.llama_no_extra_bufts else ""
    return {**result, "seconds": seconds, "dtype": f"llama-cpp-python {llama_cpp.__version__}{extra}"}


def child(args) -> int:
    work = Path(args.work)
    if args.child != "llama.cpp":  # llama.cpp's venv has no torch
        import wslm  # noqa: F401  (before torch: wslm's OMP_WAIT_POLICY default must reach libgomp)

        # isort: split
        import torch

        torch.set_num_threads(args.threads)
    if args.child == "reference":
        result = run_reference(args, work)
    elif args.child == "llama.cpp":
        result = run_llama_cpp(args, work)
    else:
        result = run_wslm(args.child, args, work)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def spawn(
    name: str, args, work: Path, python: str = sys.executable, no_extra_bufts: bool = False
) -> dict | None:
    cmd = [python, __file__, "--child", name, "--work", str(work), "--model-path", args.model_path,
           "--window", str(args.window), "--stride", str(args.stride), "--threads", str(args.threads),
           "--limit-tokens", str(args.limit_tokens or 0)]  # fmt: skip
    if no_extra_bufts:
        cmd.append("--llama-no-extra-bufts")
    env = {"WSLM_CPU_COMPILE": "0", **os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    print(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
    return None


def _tree_state() -> str:
    """HEAD, and a hash of the uncommitted changes under wslm/ (other work may be landing while this runs)."""
    try:
        git = ["git", "-C", str(ROOT)]
        head = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        diff = subprocess.run([*git, "diff", "HEAD", "--", "wslm"], capture_output=True).stdout
        new = subprocess.run([*git, "ls-files", "--others", "--exclude-standard", "--", "wslm"], capture_output=True,
                             text=True).stdout.split()  # fmt: skip
    except OSError:
        return "unknown"
    if not diff and not new:
        return head or "unknown"
    import hashlib

    h = hashlib.sha1(diff)
    for name in sorted(new):
        h.update((ROOT / name).read_bytes() if (ROOT / name).is_file() else b"")
    return f"{head} + uncommitted changes in wslm/ (sha1 {h.hexdigest()[:10]})"


def table(results: dict) -> tuple[str, list[str]]:
    llama = (results.get("llama.cpp") or {}).get("ppl")
    rows = ["| engine | compute dtype | perplexity | vs llama.cpp | top-1 agreement vs reference | "
            "mean KL vs reference (nats) | forward s (shared machine) |", "|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, r in results.items():
        label = REF_NAME if name == "reference" else name
        if not r:
            rows.append(f"| {label} | failed | | | | | |")
            continue
        vs = f"{r['ppl'] / llama:.4f}x" if llama else "-"
        kl = max(r["kl"], 0.0)  # >= 0 in exact arithmetic: a tiny negative sum is rounding
        rows.append(f"| {label} | {r['dtype']} | {r['ppl']:.4f} | {vs} | {100 * r['top1']:.2f}% | "
                    f"{kl:.5f} | {r['seconds']:.1f} |")  # fmt: skip
    verdict = []
    lc = results.get("llama.cpp")
    default = results.get("wslm default")
    checks = [("wslm default", default)]
    if default and default["dtype"] != "bfloat16" and results.get("wslm bfloat16"):
        checks.append(
            ("wslm bfloat16 (dtype=auto's choice on a CPU with bf16 arithmetic)", results["wslm bfloat16"])
        )
    for label, d in checks if lc else []:
        if not d:
            continue
        ppl_ok = abs(d["ppl"] / lc["ppl"] - 1) <= 0.005
        kl_ok = d["kl"] <= lc["kl"]
        verdict.append(f"Target (issue 25), {label}: perplexity within 0.5% of llama.cpp's: "
                       f"{'met' if ppl_ok else 'NOT met'} ({100 * (d['ppl'] / lc['ppl'] - 1):+.2f}%); "
                       f"KL no larger than llama.cpp's: {'met' if kl_ok else 'NOT met'} "
                       f"({d['kl']:.5f} vs {lc['kl']:.5f}).")  # fmt: skip
    return "\n".join(rows), verdict


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="a GGUF file (default: the demo model)")
    p.add_argument("--window", type=int, default=512, help="tokens per window (at most the model's context)")
    p.add_argument("--stride", type=int, default=256, help="tokens between window starts")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--llama-python", default="/work/llama-venv/bin/python")
    p.add_argument(
        "--only", nargs="*", default=None, help=f"a subset of {ENGINES} (the reference always runs)"
    )
    p.add_argument("--limit-tokens", type=int, default=0, help="score only the text's first N tokens (a quick "
                   "check; not written to the docs)")  # fmt: skip
    p.add_argument("--no-docs", action="store_true", help="print the table only")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--work", default=None, help=argparse.SUPPRESS)
    p.add_argument("--model-path", default=None, help=argparse.SUPPRESS)
    p.add_argument("--llama-no-extra-bufts", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--formats", nargs="*", default=None, help="per GGUF block format instead (Q4_0 ... Q6_K; none "
                   "named: all): hands over to bench/fidelity_formats.py with the other flags")  # fmt: skip
    args = p.parse_args()
    if args.formats is not None and not args.child:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import fidelity_formats

        argv = ["--window", str(args.window), "--stride", str(args.stride), "--threads", str(args.threads),
                "--llama-python", args.llama_python, "--limit-tokens", str(args.limit_tokens)]  # fmt: skip
        return fidelity_formats.main(argv + (["--formats", *args.formats] if args.formats else [])
                                     + (["--no-docs"] if args.no_docs else []))  # fmt: skip
    windows(args.window + 1, args.window, args.stride)  # a bad --window/--stride fails here, not in a child
    if args.child:
        return child(args)
    if args.model:
        args.model_path = str(Path(args.model).resolve())
    else:
        sys.path.insert(0, str(ROOT))
        from wslm.demo import demo_model_path

        args.model_path = str(demo_model_path())
    tree = _tree_state()
    names = ["reference", *[n for n in (args.only or ENGINES) if n != "reference"]]
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="wslm-fidelity-") as tmp:
        work = Path(tmp)
        for name in names:
            if name == "llama.cpp":
                if not Path(args.llama_python).exists():
                    print("llama.cpp skipped: no", args.llama_python, file=sys.stderr)
                    continue
                results[name] = spawn(name, args, work, args.llama_python)
                if results[name] is None:  # e.g. a crash in its AMX repack buffers: once more without them
                    results[name] = spawn(name, args, work, args.llama_python, no_extra_bufts=True)
            elif name == "wslm float32" and (results.get("wslm default") or {}).get("dtype") == "float32":
                results[name] = {**results["wslm default"], "dtype": "float32 (= wslm default on this CPU)"}
            else:
                results[name] = spawn(name, args, work)
            print(name, results[name], flush=True)
            if name == "reference" and results[name] is None:
                return 1
        count = len(json.loads((work / "tokens.json").read_text())["tokens"])
    rows, verdict = table(results)
    if _tree_state() != tree:
        tree += ", CHANGED while this ran (rows may have measured different code)"
    ref = results["reference"]
    model = Path(args.model_path)
    command = shlex.join(["bench/fidelity.py", *sys.argv[1:]])
    body = (
        f"Model `{model.name}` ({model.stat().st_size / 2**20:.0f} MiB). Text: bench/data/fidelity_text.md "
        f"({count} tokens: English, Chinese, code), {args.window}-token windows every {args.stride} tokens, "
        f"{ref['positions']} scored positions, the same token ids and windows in every engine, one window per "
        f"forward (batch of one). {args.threads} threads. Reference: transformers' model dequantized to float32. "
        f"KL(reference || engine) over the full vocabulary. wslm rows keep the GGUF quantized unless the row "
        f"says otherwise; WSLM_CPU_COMPILE={os.environ.get('WSLM_CPU_COMPILE', '0')}. Tree: {tree}. "
        f"Command: `.venv/bin/python {command.strip()}`.\n\n{rows}\n"
        + ("\n" + "\n".join(verdict) if verdict else "")
    )
    print(body)
    if args.no_docs or args.limit_tokens:
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import machine

    print("written to", machine.append_section("fidelity to the GGUF file (bench/fidelity.py)", body))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
