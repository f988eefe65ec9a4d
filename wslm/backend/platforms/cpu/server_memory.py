"""What a CPU server takes besides its weights and its KV pool, in one place: `wslm models list/info` add it
to a model's memory estimate ("needs about"), and the GUI shows that number, so that it is what `wslm serve`
really takes (tests/test_gguf_memory.py checks within 10%). Pure (no torch), like kv_sizing.

Measured on `wslm serve demo` (2-core AMD EPYC, float32, defaults): 1.86 GiB resident once ready = 90 MiB
of weights + the 1.41 GiB KV pool of that day (the pool is sized by need now: kv_sizing.plan_kv_pool) + ~370
MiB of its own (Python, torch, transformers, the HTTP server, the
tokenizer, torch's code); after the background compile of the decode step ended, 2.11 GiB: inductor's
modules and caches, and the compiled graph's own copy of the weights (freezing repacks them)."""

from __future__ import annotations

import os
import shutil

from wslm import envs

# A server's own memory, without a model's weights and KV (Python, torch, transformers, uvicorn, tokenizer).
CPU_RUNTIME_BYTES = 370 << 20
# What the decode step's compile adds besides the graph's weight copy (inductor, dynamo, sympy, the graph).
COMPILE_RUNTIME_BYTES = 200 << 20
# By default only models up to this many weight bytes compile: the graph keeps its own repacked copy of the
# weights, which small models afford and which matters most for them (their steps are overhead, not
# bandwidth). WSLM_CPU_COMPILE=1 compiles any size (decode_compiled.why_not reads it from here).
AUTO_MAX_WEIGHT_BYTES = 1 << 30


def has_cxx_compiler() -> bool:
    return bool(shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++") or shutil.which("clang++"))


def compiles(weight_bytes: int, enforce_eager: bool = False) -> bool:
    """Whether a CPU server of a model with these weights compiles its decode step (WSLM_CPU_COMPILE)."""
    setting = envs.get("WSLM_CPU_COMPILE")  # None: auto
    if setting is False or enforce_eager:
        return False
    if setting is None and weight_bytes > AUTO_MAX_WEIGHT_BYTES:
        return False
    return has_cxx_compiler()


def cpu_server_overhead_bytes(weight_bytes: int) -> int:
    """Bytes a CPU server takes besides the weights and the KV pool, once its background compile (if any)
    has run."""
    extra = CPU_RUNTIME_BYTES
    if compiles(weight_bytes):
        extra += COMPILE_RUNTIME_BYTES + weight_bytes
    return extra
