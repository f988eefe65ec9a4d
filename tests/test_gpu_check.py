"""bench/gpu_check.py without a CUDA device (CUDA_VISIBLE_DEVICES hides any): it says there is nothing to
check and exits 0 at once, writing that line to --out. The checks themselves need a GPU: see its docstring."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_without_cuda_it_says_so_and_exits_0(tmp_path):
    out = tmp_path / "gpu_check.md"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_check.py"), "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "no CUDA device: nothing to check" in proc.stdout
    assert "no CUDA device: nothing to check" in out.read_text()
    assert time.monotonic() - started < 60  # torch's import, and nothing else
