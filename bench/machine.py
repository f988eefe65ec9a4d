"""One line describing the machine a benchmark ran on, for docs/benchmarks.md."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def describe() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        import psutil

        mem = f", {psutil.virtual_memory().total / 2**30:.0f} GiB RAM"
    except ImportError:
        pass
    gpu = ""
    try:
        import torch

        if torch.cuda.is_available():
            gpu = f", GPU {torch.cuda.get_device_name(0)}"
        else:
            gpu = f", no GPU (torch {torch.__version__})"
    except ImportError:
        pass
    return f"{cpu}, {os.cpu_count()} cores{mem}{gpu}, {platform.system()} {platform.release()}"


def append_section(title: str, body: str) -> Path:
    """Append a dated section to docs/benchmarks.md and return its path."""
    import datetime

    path = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
    if not path.exists():
        path.write_text("# Benchmarks\n\nEach section: what ran, on which machine, when.\n")
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    with path.open("a", encoding="utf-8") as f:
        f.write(f"\n## {title} ({stamp})\n\nMachine: {describe()}\n\n{body.rstrip()}\n")
    return path
