"""Random-weight model files of real shapes for bench/realsize.py: a GGUF base (F16 or BF16, written tensor
by tensor), quantized by llama.cpp's own quantizer, and an HF safetensors folder (bf16).

The vocabulary and tokenizer are the demo's (SmolLM2: 49152 tokens, wslm.demo.demo_model_path()), so the
embedding and LM head are smaller than the real models' (128256 for Llama 3, 151936 for Qwen3): the layers
have the real shapes, the vocabulary rows do not. Weights are normal * 0.02 (norms 1.0), drawn once into a
pool and read from it at random offsets (drawing 8 billion normals would take longer than the benchmark):
the values quantize as real weights do, nothing here is a trained model. Files go to $WSLM_BENCH_CACHE or
~/.cache/wslm-bench/ and are reused when present."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Shape:
    name: str
    arch: str  # the GGUF architecture
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int  # dense FFN; for MoE the expert FFN
    tied: bool = True
    head_dim: int | None = None
    experts: int = 0
    experts_used: int = 0
    context: int = 8192  # the GGUF's context length (smaller than the real 128k: the KV pool is sized by it)
    rope_theta: float = 500000.0

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden // self.heads


SHAPES = {
    # Llama-3.2-3B: hidden 3072, 28 layers, 24 heads / 8 KV heads, FFN 8192, tied embeddings.
    "3b": Shape("3b", "llama", 3072, 28, 24, 8, 8192, tied=True),
    # Llama-3.1-8B: hidden 4096, 32 layers, 32 / 8 heads, FFN 14336, separate LM head.
    "8b": Shape("8b", "llama", 4096, 32, 32, 8, 14336, tied=False),
    # Qwen3-30B-A3B's layer (hidden 2048, 32 / 4 heads of 128, 128 experts of FFN 768, 8 used) with 24 of its 48
    # layers: ~14.6B parameters, Q4_K_M ~9 GB, so it fits a 24 GiB machine beside its F16 base on disk.
    "moe": Shape("moe", "qwen3moe", 2048, 24, 32, 4, 768, tied=False, head_dim=128, experts=128, experts_used=8,
                 rope_theta=1000000.0),
    # For the test: two small layers (tests/test_bench_realsize.py).
    "tiny": Shape("tiny", "llama", 256, 2, 4, 2, 512, tied=True),
}
QUANTS = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0")
# llama.cpp's llama_ftype numbers (include/llama.h)
FTYPES = {"Q4_0": 2, "Q8_0": 7, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}


def cache_dir() -> Path:
    path = Path(os.environ.get("WSLM_BENCH_CACHE") or Path.home() / ".cache" / "wslm-bench")
    path.mkdir(parents=True, exist_ok=True)
    return path


def tensors(shape: Shape, vocab: int) -> list[tuple[str, tuple[int, ...], bool]]:
    """(GGUF name, numpy shape [rows, cols], is a norm) in the order llama.cpp's converter writes them."""
    h, d = shape.hidden, shape.dim_head
    out = [("token_embd.weight", (vocab, h), False)]
    for i in range(shape.layers):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (h,), True),
                (b + "attn_q.weight", (shape.heads * d, h), False),
                (b + "attn_k.weight", (shape.kv_heads * d, h), False),
                (b + "attn_v.weight", (shape.kv_heads * d, h), False),
                (b + "attn_output.weight", (h, shape.heads * d), False),
                (b + "ffn_norm.weight", (h,), True)]  # fmt: skip
        if shape.arch == "qwen3moe":
            e, f = shape.experts, shape.intermediate
            out += [(b + "attn_q_norm.weight", (d,), True), (b + "attn_k_norm.weight", (d,), True),
                    (b + "ffn_gate_inp.weight", (e, h), False),
                    (b + "ffn_gate_exps.weight", (e, f, h), False),
                    (b + "ffn_up_exps.weight", (e, f, h), False),
                    (b + "ffn_down_exps.weight", (e, h, f), False)]  # fmt: skip
        else:
            f = shape.intermediate
            out += [(b + "ffn_gate.weight", (f, h), False), (b + "ffn_up.weight", (f, h), False),
                    (b + "ffn_down.weight", (h, f), False)]  # fmt: skip
    out.append(("output_norm.weight", (h,), True))
    if not shape.tied:
        out.append(("output.weight", (vocab, h), False))
    return out


def _copy_tokenizer(writer, demo: Path) -> int:
    """The demo GGUF's tokenizer.* metadata into writer; returns the vocabulary size."""
    import gguf

    reader = gguf.GGUFReader(demo)
    vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        value = field.contents()
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        if name == "tokenizer.ggml.tokens":
            vocab = len(value)
        writer.add_key_value(name, value, kind, sub_type=sub)
    return vocab


class _Pool:
    """Normal * 0.02 values, drawn once, served as slices from random offsets."""

    def __init__(self, dtype, size: int = 1 << 24, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.values = (self.rng.standard_normal(size, dtype=np.float32) * 0.02).astype(dtype)

    def take(self, n: int) -> np.ndarray:
        out = np.empty(n, dtype=self.values.dtype)
        done = 0
        while done < n:
            start = int(self.rng.integers(0, self.values.size))
            part = self.values[start : start + n - done]
            out[done : done + part.size] = part
            done += part.size
        return out


def write_base(shape: Shape, path: Path, base: str = "F16") -> Path:
    """The unquantized GGUF of `shape` with the demo's tokenizer, written one tensor at a time."""
    import gguf

    from wslm.demo import demo_model_path

    qtype = {"F16": gguf.GGMLQuantizationType.F16, "BF16": gguf.GGMLQuantizationType.BF16}[base]
    tmp = path.with_suffix(".part")
    w = gguf.GGUFWriter(tmp, shape.arch)
    vocab = _copy_tokenizer(w, demo_model_path())
    w.add_name(f"wslm-bench random {shape.name}")
    w.add_block_count(shape.layers)
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_feed_forward_length(shape.intermediate if not shape.experts else shape.intermediate * shape.experts_used)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_key_length(shape.dim_head)
    w.add_value_length(shape.dim_head)
    w.add_rope_dimension_count(shape.dim_head)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(1e-5 if shape.arch == "llama" else 1e-6)
    w.add_vocab_size(vocab)
    w.add_file_type(1 if base == "F16" else 32)
    if shape.experts:
        w.add_expert_count(shape.experts)
        w.add_expert_used_count(shape.experts_used)
        w.add_expert_feed_forward_length(shape.intermediate)
    specs = tensors(shape, vocab)
    for name, dims, norm in specs:
        dtype = np.float32 if norm else (np.float16 if base == "F16" else np.uint16)
        n = int(np.prod(dims))
        w.add_tensor_info(name, dims, np.dtype(dtype), n * np.dtype(dtype).itemsize,
                          raw_dtype=gguf.GGMLQuantizationType.F32 if norm else qtype)  # fmt: skip
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    pool = _Pool(np.float16 if base == "F16" else np.float32)
    for _name, dims, norm in specs:
        n = int(np.prod(dims))
        if norm:
            data = np.ones(dims, dtype=np.float32)
        else:
            data = np.empty(n, dtype=np.float16 if base == "F16" else np.uint16)
            step = 1 << 26  # 128 MiB at a time: never a whole large tensor's float32 copy
            for i in range(0, n, step):
                part = pool.take(min(step, n - i))
                data[i : i + part.size] = part if base == "F16" else (part.view(np.uint32) >> 16).astype(np.uint16)
            data = data.reshape(dims)
        w.write_tensor_data(data)
        del data
    w.close()
    tmp.rename(path)
    return path


QUANTIZE = """
import sys, llama_cpp
src, dst, ftype, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
p = llama_cpp.llama_model_quantize_default_params()
p.ftype, p.nthread = ftype, threads
rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), p)
sys.exit(rc)
"""


def gguf_file(shape_name: str, quant: str, llama_python: str | None, base: str = "F16",
              log=print) -> Path:  # fmt: skip
    """The cached file of shape × quant, made when missing: F16/BF16 is the base itself, the rest are
    llama.cpp's quantizer run in its own venv (llama_python) on the base."""
    shape = SHAPES[shape_name]
    folder = cache_dir()
    base_path = folder / f"{shape.name}-{base}.gguf"
    if quant in ("F16", "BF16"):
        base, base_path = quant, folder / f"{shape.name}-{quant}.gguf"
    out = folder / f"{shape.name}-{quant}.gguf"
    if out.exists():  # made before (its base may be gone: the MoE's F16 is 30 GB)
        return out
    if not base_path.exists():
        log(f"writing {base_path} ...")
        write_base(shape, base_path, base)
    if quant in ("F16", "BF16"):
        return base_path
    out = folder / f"{shape.name}-{quant}.gguf"
    if out.exists():
        return out
    if not llama_python or not Path(llama_python).exists():
        if quant in GGUF_PY_QUANTS:
            alt = folder / f"{shape.name}-{quant}-ggufpy.gguf"
            if not alt.exists():
                log(f"no llama.cpp: quantizing {base_path.name} -> {alt.name} with gguf-py (every 2-D weight) ...")
                quantize_gguf_py(base_path, alt, quant)
            return alt
        raise FileNotFoundError(f"{out} is missing and llama.cpp's quantizer needs llama-cpp-python: give "
                                "--llama-python (or WSLM_LLAMA_PYTHON) a venv that has it.")  # fmt: skip
    log(f"quantizing {base_path.name} -> {out.name} with llama.cpp ...")
    tmp = out.with_suffix(".part")
    rc = subprocess.run([llama_python, "-c", QUANTIZE, str(base_path), str(tmp), str(FTYPES[quant]),
                         str(os.cpu_count() or 1)], stdout=subprocess.DEVNULL).returncode  # fmt: skip
    if rc != 0 or not tmp.exists():
        raise RuntimeError(f"llama.cpp's quantizer failed ({rc}) on {base_path} -> {quant}")
    tmp.rename(out)
    return out


GGUF_PY_QUANTS = ("Q4_0", "Q8_0")  # what gguf-py can quantize of QUANTS (no K-quants)


def quantize_gguf_py(src: Path, dst: Path, quant: str) -> Path:
    """Without llama.cpp: every 2-D weight of src to `quant` with gguf-py, the rest copied, one tensor at a time.
    Not llama.cpp's file: its Q4_0 keeps the LM head in Q6_K; this one quantizes it as the rest."""
    import gguf

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from wslm.backend.quant.gguf_file import GGUFFile

    qtype = gguf.GGMLQuantizationType[quant]
    f = GGUFFile(src)
    reader = gguf.GGUFReader(src)  # the metadata as gguf-py types (the tensors are read from f's mapping)
    arch = f.values["general.architecture"]
    w = gguf.GGUFWriter(dst.with_suffix(".part"), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        kind = field.types[0]
        value = field.contents()
        if name == "general.file_type":
            value = {"Q4_0": 2, "Q8_0": 7}[quant]
        w.add_key_value(name, value, kind, sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    del reader
    plan = []
    for t in f.tensors:
        rows = tuple(reversed(t.shape))
        quantize = len(rows) >= 2 and rows[-1] % gguf.GGML_QUANT_SIZES[qtype][0] == 0
        kind = qtype if quantize else t.tensor_type
        nbytes = t.n_elements * gguf.GGML_QUANT_SIZES[kind][1] // gguf.GGML_QUANT_SIZES[kind][0]
        plan.append((t, quantize))
        w.add_tensor_info(t.name, rows, np.dtype(np.float32), nbytes, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t, quantize in plan:
        if quantize:
            data = t.data.reshape(-1, t.data.shape[-1])
            out = np.concatenate([gguf.quants.quantize(data[i : i + 4096].astype(np.float32), qtype)
                                  for i in range(0, data.shape[0], 4096)])  # fmt: skip
            w.write_tensor_data(out)
        else:
            w.write_tensor_data(np.array(t.data))
    w.close()
    f.close()
    dst.with_suffix(".part").rename(dst)
    return dst


def weight_bytes_per_token(path: Path) -> dict[str, int]:
    """Bytes of the file's weights a decode step reads: every tensor but the token embedding (one row is
    read), plus the embedding when it is also the LM head (tied); for MoE only experts_used of the experts."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from wslm.backend.quant.gguf_file import GGUFFile

    f = GGUFFile(path)
    try:
        arch = f.values.get("general.architecture")
        used, total_experts = f.values.get(f"{arch}.expert_used_count"), f.values.get(f"{arch}.expert_count")
        names = {t.name for t in f.tensors}
        total = read = 0
        for t in f.tensors:
            total += t.n_bytes
            if t.name == "token_embd.weight" and "output.weight" in names:
                continue
            if "_exps." in t.name and used and total_experts:
                read += t.n_bytes * used // total_experts
            else:
                read += t.n_bytes
        return {"file_weight_bytes": total, "read_per_token": read, "file_bytes": path.stat().st_size}
    finally:
        f.close()


def hf_folder(shape_name: str = "3b") -> Path:
    """An HF safetensors folder (bf16) of a Llama shape with the demo's tokenizer, one shard per layer."""
    import torch
    from safetensors.torch import save_file

    shape = SHAPES[shape_name]
    folder = cache_dir() / f"{shape.name}-hf-bf16"
    if (folder / "model.safetensors.index.json").exists():
        return folder
    from wslm.backend.loader.model_loader import load_tokenizer
    from wslm.backend.loader.model_source import resolve_model

    folder.mkdir(parents=True, exist_ok=True)
    tok = load_tokenizer(resolve_model("demo"))
    tok.save_pretrained(folder)
    vocab = len(tok)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": shape.hidden,
              "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
              "num_key_value_heads": shape.kv_heads, "intermediate_size": shape.intermediate,
              "vocab_size": vocab, "max_position_embeddings": shape.context, "rms_norm_eps": 1e-5,
              "rope_theta": shape.rope_theta, "tie_word_embeddings": shape.tied, "torch_dtype": "bfloat16",
              "hidden_act": "silu", "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    gen = torch.Generator().manual_seed(0)

    def rand(*dims: int) -> torch.Tensor:
        return (torch.randn(*dims, generator=gen) * 0.02).to(torch.bfloat16)

    h, d = shape.hidden, shape.dim_head
    index: dict[str, str] = {}
    count = shape.layers + 1

    def layer(i: int) -> dict[str, torch.Tensor]:
        p = f"model.layers.{i}."
        return {p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
                p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
                p + "self_attn.q_proj.weight": rand(shape.heads * d, h),
                p + "self_attn.k_proj.weight": rand(shape.kv_heads * d, h),
                p + "self_attn.v_proj.weight": rand(shape.kv_heads * d, h),
                p + "self_attn.o_proj.weight": rand(h, shape.heads * d),
                p + "mlp.gate_proj.weight": rand(shape.intermediate, h),
                p + "mlp.up_proj.weight": rand(shape.intermediate, h),
                p + "mlp.down_proj.weight": rand(h, shape.intermediate)}  # fmt: skip

    for n in range(count):  # one shard in memory at a time
        if n == 0:
            part = {"model.embed_tokens.weight": rand(vocab, h), "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
            if not shape.tied:
                part["lm_head.weight"] = rand(vocab, h)
        else:
            part = layer(n - 1)
        file = f"model-{n + 1:05d}-of-{count:05d}.safetensors"
        save_file(part, str(folder / file), metadata={"format": "pt"})
        index.update({k: file for k in part})
        del part
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    return folder
