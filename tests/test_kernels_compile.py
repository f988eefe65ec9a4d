"""Every Triton launch configuration the wrappers can pick compiles for sm_89/90 (all of sm_80/86/89/90 with
WSLM_COMPILE_ALL=1) without a GPU.

triton.compile(ASTSource(...), target=GPUTarget("cuda", cc, 32)) runs Triton's whole pipeline and ptxas
(shipped in the triton wheel) for a card that is not there; a configuration fails when it does not
compile, needs more shared memory than the card allows, or spills registers. The set compiled is one
launch per distinct tile configuration of the cross product dtype x head_dim x GQA group x block size x
target (kernel_compile.launches), with the launch parameters taken from the same pure
functions the wrappers call (wslm.kernels.configs). Triton's on-disk cache makes reruns fast."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("triton")

import kernel_compile as compile_check

from wslm.kernels import configs  # noqa: E402


def test_compiled_set_covers_every_config_the_wrappers_pick():
    everything = compile_check.all_launches()
    chosen = compile_check.launches()
    assert {compile_check.resource_key(x) for x in everything} == {compile_check.resource_key(x) for x in chosen}
    assert {x.capability for x in chosen} == set(configs.TARGETS)
    assert {x.dtype for x in chosen} == set(configs.DTYPES)
    consts = [dict(x.constexprs) for x in chosen]
    assert {c["NUM_GROUPS"] for c in consts if "NUM_GROUPS" in c} == set(compile_check.GROUPS)
    assert {c["BLOCK_SIZE"] for c in consts if "BLOCK_SIZE" in c} == set(compile_check.BLOCK_SIZES)
    assert {c["HEAD_DIM"] for c in consts if "HEAD_DIM" in c} >= {64, 128, 256}
    kernels = {x.kernel.split(":")[1] for x in chosen}
    assert {"_prefill_kernel", "_decode_kernel", "_decode_reduce_kernel", "_rms_norm_kernel", "_rotary_kernel",
            "_reshape_and_cache_kernel", "_gguf_gemv_kernel", "_gguf_gemm_kernel", "_gguf_dequant_kernel"} <= kernels


def test_wrappers_launch_what_the_config_functions_return(monkeypatch):
    # Under the interpreter the wrappers plan for the smallest card; the configs they use come from configs.
    import torch

    os.environ.setdefault("TRITON_INTERPRET", "1")
    if torch.cuda.is_available():
        pytest.skip("checked under the interpreter")
    from kernel_testing import make_paged_batch, naive_attention

    from wslm.kernels import paged_attention

    calls = []
    for name in ("prefill_config", "decode_config"):
        real = getattr(configs, name)
        monkeypatch.setattr(configs, name, lambda *a, _r=real, _n=name: calls.append((_n, a)) or _r(*a))
    for q_lens in ([3, 1], [1, 1]):
        batch = make_paged_batch(q_lens, [20, 9], 4, 2, 32, 16)
        out = paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.cu_seqlens_q,
                              batch.seq_lens, 0.2, backend="triton")
        torch.testing.assert_close(out, naive_attention(batch, 0.2), atol=1e-5, rtol=1e-5)
    assert calls == [
        ("prefill_config", ("float32", 32, 2, 3, configs.INTERPRETER_CAPABILITY)),
        ("decode_config", ("float32", 32, 2, configs.INTERPRETER_CAPABILITY)),
    ]


# Compiling every target costs minutes on a 2-core CI machine, so by default the suite compiles for RTX 40
# (sm_89: the consumer cards our users own, with the tightest shared-memory limit, 99 KiB, which sm_86 shares)
# and Hopper (sm_90: another code path, the card a lent device has). WSLM_COMPILE_ALL=1, or
# `python -m kernel_compile`, checks sm_80 and sm_86 too.
DEFAULT_TARGETS = ((8, 9), (9, 0))


@pytest.mark.slow
def test_every_launch_fits_every_target():
    targets = configs.TARGETS if os.environ.get("WSLM_COMPILE_ALL") == "1" else DEFAULT_TARGETS
    # The GGUF block kernels (~90 launches per target) have their own test: tests/test_kernels_gguf.py.
    items = [x for x in compile_check.launches() if x.capability in targets and "triton_gguf" not in x.kernel]
    # The case, as a control that the check sees what a launch on an RTX 30/40 would hit: float32
    # prefill at head_dim 128 with 64 x 64 tiles and 2 stages needs ~113 KiB of shared memory.
    control = compile_check.Launch(
        "triton_paged_attention:_prefill_kernel", "float32",
        (("NUM_GROUPS", 1), ("GROUP_PAD", 1), ("BLOCK_SIZE", 16), ("HEAD_DIM", 128), ("HEAD_DIM_PAD", 128),
         ("BLOCK_M", 64), ("BLOCK_Q", 64), ("BLOCK_N", 64), ("SLIDING", False), ("SOFT_CAP", False),
         ("HAS_SINKS", False), ("DOT_PRECISION", "tf32")),
        8, 2, (8, 6), (("sinks_ptr", "fp32"),), ("qk_scale", "cap_log2"),
    )
    results = compile_check.compile_all([control, *items], jobs=min(4, os.cpu_count() or 1))
    assert any("shared memory" in p for p in results[0].problems()), results[0].problems()
    failures = [f"{r.launch.label()}: {'; '.join(r.problems())}" for r in results[1:] if r.problems()]
    assert not failures, f"{len(failures)} of {len(items)} launches do not fit:\n" + "\n".join(failures)
