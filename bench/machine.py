"""One line describing the machine a benchmark ran on, for docs/benchmarks.md."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path


def describe() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
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


def append_section(title: str, body: str) -> Path:
    """Append a dated section to docs/benchmarks.md and return its path."""
    import datetime

    path = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
    if not path.exists():
        path.write_text("# Benchmarks\n\nEach section: what ran, on which machine, when.\n")
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    with path.open("a", encoding="utf-8") as f:
        f.write(f"\n## {stamp} — {title}\n\nMachine: {describe()}\n\n{body.rstrip()}\n")
    return path


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
