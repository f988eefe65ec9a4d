"""End to end: a tiny random model greedy-decodes the same tokens through the Triton kernels as through
the PyTorch ones (under TRITON_INTERPRET=1 on CPU; compiled on a CUDA machine)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    # Before the kernel modules are first imported: @triton.jit reads it at decoration time.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from wslm.backend import LLM, SamplingParams  # noqa: E402

PROMPTS = [
    "Hello there, how are you today?",
    "A",
    "The quick brown fox jumps over the lazy dog " * 3,
    "The quick brown fox jumps over the lazy dog, said the",
]


def _greedy(folder, backend: str, monkeypatch) -> list[list[int]]:
    monkeypatch.setenv("WSLM_KERNEL_BACKEND", backend)
    # A small token budget chunks the long prompts: prefill on a cached prefix and decode+prefill batches.
    llm = LLM(str(folder), kv_cache_memory=8 << 20, block_size=16, max_num_batched_tokens=24, dtype="float32")
    tok = llm.get_tokenizer()
    ids = [tok.encode(p) for p in PROMPTS]
    outs = llm.generate([{"prompt_token_ids": i} for i in ids], SamplingParams(temperature=0, max_tokens=12))
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_triton_path_matches_torch_path(tiny_models, arch, monkeypatch):
    import wslm.kernels.triton_paged_attention as tpa

    calls = []
    real = tpa.paged_attention
    monkeypatch.setattr(tpa, "paged_attention", lambda *a, **kw: calls.append(a[0].shape[0]) or real(*a, **kw))
    want = _greedy(tiny_models[arch], "torch", monkeypatch)
    assert not calls
    got = _greedy(tiny_models[arch], "triton", monkeypatch)
    assert got == want
    assert calls and min(calls) < max(calls)  # the Triton kernels ran, on decode and prefill steps
    assert all(len(t) > 0 for t in want)
