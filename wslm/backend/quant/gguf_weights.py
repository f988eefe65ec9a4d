"""GGUF weights read one tensor at a time from the memory-mapped file (gguf_file.py). By default
(WSLM_GGUF_BLOCKS) the types of gguf_blocks.BLOCK_TYPES (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) stay
as they are in the file: GGUFBlockWeight views of the mapping (no copy; use_mmap=False, `--no-mmap`, reads
them into private memory), multiplied in place by kernels/cpu_gguf.c. With WSLM_GGUF_BLOCKS=0, and for
MoE experts and the other quantized types (Q2_K, Q3_K), they are repacked, never dequantized whole (one
expert at a time): Q4_0, Q4_1 and Q4_K to int4 groups of 32
exactly (same codes, same scales up to bf16 rounding); the others to int8 per output channel (no fewer bits
than the source; at most half a row step off); F32/F16/BF16 stay dense. A
float32 model under WSLM_QUANT_FLOAT32=1 gets the file's values exactly (dequantize_mode). Names come out
as HF's, with llama.cpp's q/k row permutation undone, so the model code loads them like a safetensors
checkpoint.

WSLM_GGUF_DEQUANTIZE=1 yields every weight dequantized (float32) instead, as transformers does — for
exact comparisons with HF, which the tests make."""

from __future__ import annotations

import logging
import re
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from wslm import envs
from wslm.backend.quant.gguf_blocks import BLOCK_TYPES, TYPE_IDS, GGUFBlockWeight
from wslm.backend.quant.gguf_convert import convert_tensor as _convert
from wslm.backend.quant.gguf_file import GGUFFile
from wslm.backend.quant.gguf_formats import INT8_TYPES

_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    # Qwen2/3-MoE: the router and Qwen2-MoE's shared expert with its gate.
    "ffn_gate_inp": "mlp.gate", "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj", "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
}  # fmt: skip
# MoE experts come stacked, one [experts, rows, cols] tensor per projection; HF names them one by one.
_EXPERT_NAMES = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
# Families whose llama.cpp names differ from Llama's: Phi-3 keeps its fused projections under the plain
# names; Gemma's four norms per layer reuse ffn_norm for the norm before the MLP.
_ARCH_LAYER_NAMES = {
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
    "gemma2": {
        "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
}  # fmt: skip
_ARCH_LAYER_NAMES["gemma3"] = _ARCH_LAYER_NAMES["gemma2"]
# llama.cpp's converter stores Gemma's (1 + w) norm weights as 1 + w; transformers subtracts the 1 again.
_SHIFTED_NORM_ARCHS = ("gemma2", "gemma3")
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# Architectures whose q/k rows llama.cpp's converter permuted (transformers undoes the same set).
_PERMUTED_ARCHS = ("llama", "mistral")

logger = logging.getLogger(__name__)


def dequantize_requested() -> bool:
    return envs.WSLM_GGUF_DEQUANTIZE


def dequantize_mode(dtype: torch.dtype | None = None) -> bool | str:
    """True: every quantized tensor dequantized to float32 (WSLM_GGUF_DEQUANTIZE=1, as transformers loads
    them). "exact": a float32 model under WSLM_QUANT_FLOAT32=1 keeps the int4 types packed (their codes and
    float32 scales reproduce the file exactly) and dequantizes what the int8 form would re-quantize (Q5_*,
    Q6_K, Q8_0, the K-quants below 4 bits, 4-bit embedding tables): per-row int8 moves those weights by up
    to half a row step (~3% of a Q8_0 block's largest value on the demo), enough to part from transformers
    within 40 tokens. False: the default, int4 exact, the rest to int8 (docs/benchmarks.md, fidelity)."""
    if dequantize_requested():
        return True
    return "exact" if dtype == torch.float32 and envs.WSLM_QUANT_FLOAT32 else False


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
    if m:
        part = _ARCH_LAYER_NAMES.get(arch, {}).get(m.group(2)) or _LAYER_NAMES.get(m.group(2))
        return f"model.layers.{m.group(1)}.{part}.{m.group(3)}" if part else None
    base, _, kind = gguf_name.rpartition(".")
    top = _TOP_NAMES.get(base)
    return f"{top}.{kind}" if top else None


def _unpermute_rows(n_rows: int, n_head: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's q/k permutation (transformers' reverse_permute_weights)."""
    dim = n_rows // n_head // 2
    return torch.arange(n_rows).reshape(n_head, dim, 2).transpose(1, 2).reshape(-1)


def iter_gguf_weights(
    path: str | Path, dtype: torch.dtype | None = None, use_mmap: bool = True
) -> Iterator[tuple[str, object]]:
    """(hf_name, weight) for each tensor: a dense tensor, GGUFBlockWeight, Int4Codes or Int8Weight (dtype:
    the model's, which decides dequantize_mode; use_mmap=False: block weights copied out of the mapping)."""
    # Not gguf.GGUFReader: it parses the vocabulary into arrays 1.6x the file's size (gguf_file.py).
    reader = GGUFFile(path)
    arch = str(reader.values["general.architecture"])
    n_head = _first(reader.values.get(f"{arch}.attention.head_count"))
    n_kv = _first(reader.values.get(f"{arch}.attention.head_count_kv")) or n_head
    dequant = dequantize_mode(dtype)
    yield from _iter_tensors(reader, arch, n_head, n_kv, dequant, use_mmap)
    if not dequant:
        _say_requantized(reader)
    reader.close()
    if use_mmap and envs.WSLM_GGUF_BLOCKS and not dequant and envs.WSLM_GGUF_PREFETCH:
        prefetch(Path(path))


def prefetch(path: Path, chunk: int = 8 << 20) -> threading.Thread | None:
    """Read the file once in a background thread, so that the weights mapped in place are in the page cache
    before a request needs them (a cold cache otherwise pays a disk read at the first token that touches each
    page: a MoE's experts on their first pick). Reads release the GIL; skipped when the file would not fit in
    the memory available (the kernel would evict what it had just read). Returns the thread, or None."""
    try:
        size = path.stat().st_size
        available = _mem_available()
    except OSError:
        return None
    if available is not None and size > 0.8 * available:
        logger.info("GGUF: %s (%.1f GB) is larger than the memory available to read ahead: its pages are read as "
                    "they are first used", path.name, size / 1e9)  # fmt: skip
        return None

    def read() -> None:
        start = time.perf_counter()
        buf = bytearray(chunk)
        try:
            with open(path, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass
        except OSError as exc:
            logger.debug("GGUF read-ahead of %s stopped: %s", path, exc)
            return
        logger.debug("GGUF: %s read into the page cache in %.1f s", path.name, time.perf_counter() - start)

    thread = threading.Thread(target=read, name="wslm-gguf-prefetch", daemon=True)
    thread.start()
    return thread


def _mem_available() -> int | None:
    """MemAvailable in bytes (Linux), or None."""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _say_requantized(reader: GGUFFile) -> None:
    """One log line when the file has types kept as per-row int8 instead of their own bits: what that costs."""
    kinds: dict[str, int] = {}
    for t in reader.tensors:
        if t.tensor_type.name in INT8_TYPES and t.tensor_type.name not in BLOCK_TYPES:
            kinds[t.tensor_type.name] = kinds.get(t.tensor_type.name, 0) + 1
    if kinds:
        listed = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        logger.info("GGUF: %s tensors kept as int8 per output row (no kernel of their own bit width): each weight "
                    "within 0.4%% of its row's largest; perplexity on the demo's Q8_0 table within 0.1%% of the "
                    "file's (docs/benchmarks.md, fidelity). --dtype float32 with WSLM_QUANT_FLOAT32=1 keeps them "
                    "exact.", listed)  # fmt: skip


def _first(value):
    return value[0] if isinstance(value, list) else value


def _iter_tensors(
    reader: GGUFFile, arch: str, n_head, n_kv, dequant: bool | str, use_mmap: bool = True
) -> Iterator[tuple[str, object]]:
    blocks = envs.WSLM_GGUF_BLOCKS  # the file's blocks in place (the default), or repacked
    for t in reader.tensors:
        kind = t.tensor_type.name
        m = re.fullmatch(r"blk\.(\d+)\.(ffn_\w+_exps)\.weight", t.name)
        if m and m.group(2) in _EXPERT_NAMES:
            prefix = f"model.layers.{m.group(1)}.mlp.experts"
            in_place = blocks and not dequant and kind in BLOCK_TYPES and len(t.shape) == 3
            for e, weight in enumerate(_expert_slices(t, dequant, in_place, use_mmap)):
                yield f"{prefix}.{e}.{_EXPERT_NAMES[m.group(2)]}.weight", weight
            if not in_place:  # in place, the pages are the experts' weights
                _drop_pages(reader, t)
            continue
        name = hf_name(t.name, arch)
        if name is None:  # rope_freqs and the like: the engine computes them from the config
            continue
        in_place = blocks and not dequant and kind in BLOCK_TYPES and len(t.shape) == 2
        if in_place:  # the file's blocks, where they lie (or copied once: --no-mmap)
            data = _mapped(t.data) if use_mmap else torch.from_numpy(np.array(t.data))
            weight = GGUFBlockWeight([(TYPE_IDS[kind], data)], int(t.shape[0]), name=t.name)
        else:
            weight = _read_tensor(t, kind, dequant, is_table=name.startswith(("model.embed_tokens", "lm_head")))
        if arch in _SHIFTED_NORM_ARCHS and name.endswith("norm.weight"):
            weight = weight - 1
        if arch in _PERMUTED_ARCHS and (".q_proj." in name or ".k_proj." in name):
            heads = n_head if ".q_proj." in name else n_kv
            weight = _permute(weight, _unpermute_rows(weight.shape[0], heads))
        if name.endswith(("mlp.gate.weight", "shared_expert_gate.weight")):  # small routers: plain layers
            weight = weight if isinstance(weight, torch.Tensor) else weight.dequantize(torch.float32)
            weight = weight.reshape(-1, weight.shape[-1])  # the shared gate may come as one row, [hidden]
        elif in_place:
            yield name, weight  # its pages are the weight's now: not dropped
            continue
        _drop_pages(reader, t)
        yield name, weight


def _mapped(data: np.ndarray) -> torch.Tensor:
    """A tensor over the read-only mapping itself (as llama.cpp maps the file: shared with the page cache).
    torch warns that it could write there; nothing does (the kernels only read weights)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(data)


def _expert_slices(t, dequant: bool | str = False, in_place: bool = False, use_mmap: bool = True) -> Iterator[object]:
    """Each expert's [rows, cols] weight of a stacked MoE tensor, one at a time. in_place: the expert's
    blocks where they lie in the mapped file (a GGUFBlockWeight over its rows, as a dense layer's; copied
    out with use_mmap=False), so a load touches none of the experts' bytes. Else repacked as a dense layer's
    weight of the same type is: int4 codes for Q4_0/Q4_1/Q4_K, int8 for the other quantized types, the tensor
    itself when dense, one expert unpacked at a time. (layers/moe.py keeps them per expert, any form.)"""
    experts, rows, cols = (int(d) for d in reversed(t.shape))
    per_expert = np.asarray(t.data).reshape(experts, -1)  # whole rows of one expert after another
    for e in range(experts):
        if in_place:
            raw = per_expert[e].reshape(rows, -1)
            data = _mapped(raw) if use_mmap else torch.from_numpy(np.array(raw))
            yield GGUFBlockWeight([(TYPE_IDS[t.tensor_type.name], data)], cols, name=f"{t.name}[{e}]")
            continue
        yield _convert(per_expert[e], t.tensor_type, (rows, cols), dequant, False, f"{t.name}[{e}]")


def _drop_pages(reader, t) -> None:
    """Give back the page cache of a tensor already repacked: the file is mapped, and its pages would
    otherwise count in this process's resident memory until the kernel needs them."""
    reader.drop_pages(t)


def _permute(weight, rows: torch.Tensor):
    if isinstance(weight, torch.Tensor):
        return weight[rows].contiguous()
    return weight.take_rows(rows)  # int4 codes, int8


def _read_tensor(t, kind: str, dequant: bool | str, is_table: bool):
    shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists the fastest dimension first
    return _convert(t.data, t.tensor_type, shape, dequant, is_table, t.name)
