"""The machine a benchmark ran on, the dated log (docs/benchmarks-log.md), JSON results (bench/results/) and
the child processes benchmarks run."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path


def isa() -> str:
    """The CPU's widest vector instructions, as the kernels see them ("AVX-512 BF16 VNNI", "AVX2", ...): two
    machines with the same model name (a cloud "AMD EPYC" is Zen 3 or Zen 4) run different kernels."""
    try:
        flags: set[str] = set()
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        return ""
    if "avx512f" in flags:
        extra = [name for flag, name in (("avx512_bf16", "BF16"), ("avx512_vnni", "VNNI"), ("amx_tile", "AMX"))
                 if flag in flags]  # fmt: skip
        return " ".join(["AVX-512", *extra])
    return "AVX2" if "avx2" in flags else "SSE" if flags else ""


def describe() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    if isa():
        cpu += f" ({isa()})"
    cores = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    try:
        import torch

        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU only"
        threads = torch.get_num_threads()
    except ImportError:
        device, threads = "torch not installed", 0
    mem = ""
    try:
        import psutil

        mem = f", {psutil.virtual_memory().total / 2**30:.0f} GiB RAM"
    except ImportError:
        pass
    return (f"{cpu}, {cores} cores ({usable} usable, torch threads {threads}){mem}; {device}; "
            f"{platform.system()} {platform.release()}; Python {platform.python_version()}")


ROOT = Path(__file__).resolve().parent.parent
LOG = ROOT / "docs" / "benchmarks-log.md"  # the dated log; docs/benchmarks.md is bench/summarize.py's summary
RESULTS = ROOT / "bench" / "results"


def short() -> str:
    """The machine in a few words, for a table cell: CPU model, vector instructions and core count."""
    return describe().split(" cores (", 1)[0] + " cores"


def append_section(title: str, body: str, records: list[dict] | None = None, bench: str | None = None) -> Path:
    """Append a dated section to docs/benchmarks-log.md and return its path. With records (dicts with at least
    metric, model, threads, engine, value, unit, higher_is_better), also write them as JSON under bench/results/
    for bench/summarize.py's table, each stamped with the date, the machine and the commit."""
    import datetime

    path = LOG
    if not path.exists():
        path.write_text("# Benchmark log\n\nEach section: what ran, on which machine, when. The current figures are "
                        "in docs/benchmarks.md.\n")  # fmt: skip
    now = datetime.datetime.now()
    stamp = now.strftime("%Y-%m-%d %H:%M")
    with path.open("a", encoding="utf-8") as f:
        f.write(f"\n## {stamp} — {title}\n\nMachine: {describe()}\n\n{body.rstrip()}\n")
    if records:
        save_records(bench or title.split()[0], records)
    return path


def save_records(bench: str, records: list[dict]) -> Path:
    """bench/results/BENCH-DATE.json: the records, each with bench, date (UTC), machine and commit added."""
    import datetime

    now = datetime.datetime.now(datetime.timezone.utc)
    meta = {"bench": bench, "date": now.strftime("%Y-%m-%d %H:%M UTC"), "machine": describe(), "machine_short": short(),
            "commit": git_commit()}  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{bench}-{now:%Y%m%d-%H%M%S}.json"
    out.write_text(json.dumps([{**meta, **r} for r in records], indent=1) + "\n")
    return out


def git_commit() -> str:
    """The tree's commit, +dirty when tracked files differ from it."""
    try:
        run = lambda *a: subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True).stdout.strip()  # noqa: E731
        head = run("rev-parse", "--short", "HEAD")
        return (head or "unknown") + ("+dirty" if run("status", "--porcelain", "--untracked-files=no") else "")
    except OSError:
        return "unknown"


# What a CPU without AVX-512 runs, on one that has it: torch held to its AVX2 kernels (which also gives its
# AVX2 int4 pack) and wslm's C kernels built for haswell (bench/quant.py, bench/context.py --emulate-avx2).
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "WSLM_CPU_KERNELS_CFLAGS": "-march=haswell"}


def llama_cpp_without_repack() -> None:
    """llama-cpp-python's repacked (AMX) weight buffers off for the next model it loads: some builds
    segfault in them on AMX CPUs. Runs in llama.cpp's own venv (no wslm there)."""
    import llama_cpp.llama_cpp as lib

    defaults = lib.llama_model_default_params

    def params():
        p = defaults()
        p.use_extra_bufts = False
        return p

    lib.llama_model_default_params = params


def run_child(name: str, cmd: list[str], root: Path, emulate_avx2: bool = False) -> dict | None:
    """Run a benchmark's child process (PYTHONPATH=root, AVX2_ENV when emulating) and return the JSON of its
    `RESULT ` line, or None after printing its stderr's tail."""
    env = {**os.environ, "PYTHONPATH": str(root), **(AVX2_ENV if emulate_avx2 else {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    print(f"{name} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
    return None
