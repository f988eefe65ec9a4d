"""Backend selection: None picks by device, WSLM_KERNEL_BACKEND overrides, triton stays a lazy import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from wslm.kernels import backend_description, paged_attention, rms_norm, selected_backend
from wslm.kernels.dispatch import triton_version


def test_auto_picks_torch_on_cpu_and_triton_on_cuda(monkeypatch):
    monkeypatch.delenv("WSLM_KERNEL_BACKEND", raising=False)
    assert selected_backend("cpu") == "torch"
    assert selected_backend(torch.device("cuda", 0)) == ("triton" if triton_version() else "torch")
    assert "PyTorch" in backend_description("cpu")


def test_env_overrides_auto(monkeypatch):
    monkeypatch.setenv("WSLM_KERNEL_BACKEND", "torch")
    assert selected_backend("cuda") == "torch"
    monkeypatch.setenv("WSLM_KERNEL_BACKEND", "Triton")
    assert selected_backend("cpu") == "triton"
    assert "WSLM_KERNEL_BACKEND=Triton" in backend_description("cpu")


def test_bad_env_and_bad_argument_name_the_fix(monkeypatch):
    monkeypatch.setenv("WSLM_KERNEL_BACKEND", "cuda")
    with pytest.raises(ValueError, match="use 'triton' or 'torch'"):
        selected_backend("cpu")
    assert "invalid WSLM_KERNEL_BACKEND" in backend_description("cpu")
    monkeypatch.delenv("WSLM_KERNEL_BACKEND")
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="not a kernel backend"):
        rms_norm(x, torch.ones(8), 1e-6, backend="cuda")


@pytest.mark.skipif(triton_version() is None, reason="triton not installed")
def test_triton_on_cpu_without_interpreter_says_how_to_fix(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        rms_norm(torch.randn(2, 8), torch.ones(8), 1e-6, backend="triton")


def test_import_does_not_load_triton_and_works_without_it():
    code = (
        "import sys\n"
        "import wslm.kernels\n"
        "assert 'triton' not in sys.modules, 'import wslm.kernels loaded triton'\n"
        "sys.modules['triton'] = None  # as on Windows: import triton raises ImportError\n"
        "import torch\n"
        "from wslm.kernels import paged_attention, selected_backend, backend_description\n"
        "assert selected_backend('cuda') == 'torch', selected_backend('cuda')\n"
        "print(backend_description('cuda'))\n"
        "from kernel_testing import make_paged_batch\n"
        "b = make_paged_batch([1, 3], [5, 9], 2, 1, 16, 16)\n"
        "paged_attention(b.q, b.k_cache, b.v_cache, b.block_tables, b.cu_seqlens_q, b.seq_lens, 0.25)\n"
        "try:\n"
        "    wslm.kernels.rms_norm(torch.ones(1, 4), torch.ones(4), 1e-6, backend='triton')\n"
        "except RuntimeError as e:\n"
        "    assert 'triton does not import' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('no error')\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "WSLM_KERNEL_BACKEND"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent)  # kernel_testing lives beside this file
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    assert "triton not importable" in res.stdout


def test_empty_batch_is_a_no_op():
    q = torch.empty(0, 2, 16)
    cache = torch.zeros(1, 16, 1, 16)
    out = paged_attention(q, cache, cache, torch.zeros(0, 1, dtype=torch.int32),
                          torch.zeros(1, dtype=torch.int32), torch.zeros(0, dtype=torch.int32), 0.25,
                          backend="torch")
    assert out.shape == (0, 2, 16)
