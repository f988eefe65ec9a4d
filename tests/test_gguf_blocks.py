"""GGUF weights computed in the file's own block formats (quant/gguf_blocks.py, kernels/cpu_gguf.c), read
in place from the memory-mapped file.

Exactness: for every block type the kernel's product equals gguf-py's dequantize(W) @ x within float32
rounding, where x is the activation row as the kernel sees it (rounded to int8 per 32 columns, or per 256
for the K-quants, as llama.cpp does). Measured here: within 7e-8 of sum |w| |x| (the bound below is 2^-20,
~1e-6). That rounding of x is the only approximation: the product moves from the one with the unrounded
row by 0.1-0.2% of sum |w| |x| on these random rows (asserted below 1%)."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from kernel_testing import gguf_tensor_blocks

from wslm.backend.quant.gguf_blocks import (
    BLOCK_TYPES,
    BLOCKS,
    TYPE_IDS,
    GGUFBlockWeight,
    dequantize_reference,
)

ROWS, COLS = 70, 512  # 70: a last group of rows smaller than the kernel's 4
ROUNDING = 2.0**-20  # float32 sums of a few hundred terms, relative to sum |w| |x|


def _blocks(kind: str, seed: int, rows: int = ROWS, cols: int = COLS) -> np.ndarray:
    return gguf_tensor_blocks(kind, rows, cols, seed)


@pytest.fixture(scope="module", autouse=True)
def _kept_in_blocks():
    """Blocks in place (WSLM_GGUF_BLOCKS=1, the default, set in case the environment says otherwise) and not
    dequantized (conftest dequantizes GGUF for the HF parity tests), for every test here and the processes
    they start."""
    saved = {k: os.environ.get(k) for k in ("WSLM_GGUF_DEQUANTIZE", "WSLM_GGUF_BLOCKS")}
    os.environ.update(WSLM_GGUF_DEQUANTIZE="0", WSLM_GGUF_BLOCKS="1")
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def blocks_file(tmp_path_factory):
    """One GGUF with a tensor of every block type (layer i: BLOCK_TYPES[i]), and the raw bytes written."""
    import gguf

    path = tmp_path_factory.mktemp("blocks") / "blocks.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen2")  # no q/k permutation: rows as stored
    raws = {}
    for i, kind in enumerate(BLOCK_TYPES):
        raws[kind] = _blocks(kind, seed=i)
        writer.add_tensor(f"blk.{i}.ffn_up.weight", raws[kind], raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, raws


def _loaded(path, use_mmap: bool = True) -> dict:
    from wslm.backend.quant.gguf_weights import iter_gguf_weights

    got = dict(iter_gguf_weights(path, torch.float32, use_mmap))
    return {kind: got[f"model.layers.{i}.mlp.up_proj.weight"] for i, kind in enumerate(BLOCK_TYPES)}


@pytest.fixture(scope="module")
def weights(blocks_file):
    return _loaded(blocks_file[0])


def _reference(kind: str, raw: np.ndarray) -> torch.Tensor:
    import gguf

    return torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind])).reshape(ROWS, COLS)


def _rounded(x: torch.Tensor, kind: str) -> torch.Tensor:
    from wslm.kernels import cpu_gguf

    return torch.stack([cpu_gguf.round_x(row, BLOCKS[TYPE_IDS[kind]][1]) for row in x])


def _check(out: torch.Tensor, x: torch.Tensor, ref: torch.Tensor, kind: str) -> tuple[float, float]:
    """(the kernel's error, the rounded row's distance from the unrounded one), relative to sum |w| |x|."""
    xr = _rounded(x, kind).double()
    scale = xr.abs() @ ref.double().abs().t()
    exact = xr @ ref.double().t()
    err = ((out.double() - exact).abs() / scale).max().item()
    moved = ((x.double() @ ref.double().t() - exact).abs() / scale).max().item()
    return err, moved


def _mapped_from(ptr: int, path) -> bool:
    """Whether address ptr lies in this process's mapping of the file at path."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(v, 16) for v in fields[0].split("-"))
            if lo <= ptr < hi:
                return len(fields) > 5 and fields[5] == str(path)
    return False


def test_every_type_loads_in_place(weights, blocks_file):
    from wslm.kernels import cpu_gguf

    path, raws = blocks_file
    assert cpu_gguf.library() is not None, "the C kernels did not build here"
    for kind, w in weights.items():
        assert w.kind == "gguf" and w.types == (kind,) and w.kernel().c_kernel
        (t, raw), = w.parts  # fmt: skip
        assert t == TYPE_IDS[kind] and torch.equal(raw, torch.from_numpy(raws[kind]))
        assert _mapped_from(raw.data_ptr(), path)  # a view of the mapped file, not a copy
        assert w.nbytes == raws[kind].nbytes


@pytest.mark.parametrize("kind", BLOCK_TYPES)
def test_reference_dequantizer_is_gguf_py(kind, blocks_file):
    raw = blocks_file[1][kind]
    assert torch.equal(dequantize_reference(torch.from_numpy(raw), TYPE_IDS[kind]), _reference(kind, raw))


@pytest.mark.parametrize("kind", BLOCK_TYPES)
def test_kernel_is_dequantized_weight_times_rounded_row(kind, weights, blocks_file):
    ref = _reference(kind, blocks_file[1][kind])
    x = torch.randn(6, COLS, generator=torch.Generator().manual_seed(1))
    x[2] *= 50  # rows of other magnitudes
    x[3, :40] = 0  # a block of zeros (scale 0)
    err, moved = _check(weights[kind].apply(x), x, ref, kind)
    assert err <= ROUNDING, (kind, err)
    assert moved < 0.01, (kind, moved)  # int8 rounding of the row: 0.1-0.2% measured
    bf = x.bfloat16()
    out = weights[kind].apply(bf)
    assert out.dtype == torch.bfloat16
    err_bf, _ = _check(out.float(), bf.float(), ref, kind)
    assert err_bf <= 2**-8  # the same sums, rounded to bf16 once


@pytest.mark.parametrize("kind", BLOCK_TYPES)
def test_one_row_and_many_rows_agree(kind, weights):
    """GEMM (many rows: each block of weight rows read once for all) gives each row the bits of GEMV, at
    any thread count (the rows' split over threads does not change a row's sums)."""
    w = weights[kind]
    x = torch.randn(9, COLS, generator=torch.Generator().manual_seed(2))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        many = w.apply(x)
        torch.set_num_threads(1)
        one = torch.cat([w.apply(x[i : i + 1]) for i in range(x.shape[0])])
    finally:
        torch.set_num_threads(before)
    assert torch.equal(many, one)


@pytest.mark.parametrize("kind", BLOCK_TYPES)
def test_many_rows_take_the_tiled_gemm(kind, weights, blocks_file):
    """From PREFILL_ROWS rows: the tiled block GEMM (cpu_gguf_gemm.c, tests/test_gguf_gemm.py), the same
    contract as the GEMV (the dequantized weight times the int8-rounded rows); the C dequantizer (the
    path where that GEMM is not built) still gives the file's values, up to the compiler's fused
    multiply-add."""
    from wslm.backend.quant.gguf_blocks import PREFILL_ROWS
    from wslm.kernels import cpu_gguf

    ref = _reference(kind, blocks_file[1][kind])
    w = weights[kind]
    torch.testing.assert_close(cpu_gguf.dequant(w.c_struct(), 0, ROWS), ref, rtol=2**-22, atol=1e-9)
    x = torch.randn(PREFILL_ROWS + 3, COLS, generator=torch.Generator().manual_seed(5))
    err, _ = _check(w.apply(x), x, ref, kind)
    assert err <= ROUNDING, (kind, err)


def test_permuted_and_fused_rows_stay_in_place(blocks_file):
    """q/k rows permuted as llama.cpp stores them, fused with a v of another type: the products come out
    in HF's row order, and no byte of the file is copied."""
    from wslm.backend.quant.gguf_blocks import PREFILL_ROWS
    from wslm.backend.quant.gguf_weights import _unpermute_rows
    from wslm.backend.quant.linear import fuse_rows

    k = 256
    raws = {kind: _blocks(kind, seed=7 + i, rows=64, cols=k) for i, kind in enumerate(("Q4_K", "Q4_0", "Q6_K"))}
    parts = [GGUFBlockWeight([(TYPE_IDS[kind], torch.from_numpy(raw))], k) for kind, raw in raws.items()]
    refs = [dequantize_reference(p.parts[0][1], p.parts[0][0]) for p in parts]
    q_rows, k_rows = _unpermute_rows(64, 4), _unpermute_rows(64, 2)
    fused = fuse_rows([parts[0].take_rows(q_rows), parts[1].take_rows(k_rows), parts[2]])
    dense = torch.cat([refs[0][q_rows], refs[1][k_rows], refs[2]])
    assert fused.kind == "gguf" and fused.types == ("Q4_K", "Q4_0", "Q6_K")
    assert [r.data_ptr() for _, r in fused.parts] == [p.parts[0][1].data_ptr() for p in parts]
    assert torch.equal(fused.dequantize(), dense)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(3))
    out = fused.apply(x)
    for lo, hi, kind in ((0, 64, "Q4_K"), (64, 128, "Q4_0"), (128, 192, "Q6_K")):
        err, _ = _check(out[:, lo:hi], x, dense[lo:hi], kind)
        assert err <= ROUNDING, kind
    many = torch.randn(PREFILL_ROWS + 1, k, generator=torch.Generator().manual_seed(6))  # the prefill path
    out = fused.apply(many)
    for lo, hi, kind in ((0, 64, "Q4_K"), (64, 128, "Q4_0"), (128, 192, "Q6_K")):
        err, _ = _check(out[:, lo:hi], many, dense[lo:hi], kind)
        assert err <= ROUNDING, kind


def test_plain_c_build_gives_the_same_products(blocks_file, tmp_path):
    """The build without AVX2 (the plain loops a CPU without it runs): the same contract."""
    script = textwrap.dedent(
        """
        import json, sys, torch
        sys.path.insert(0, sys.argv[2])
        import test_gguf_blocks as t
        from wslm.kernels import cpu_gguf
        assert cpu_gguf.native() == 0
        weights = t._loaded(sys.argv[1])
        x = torch.randn(3, t.COLS, generator=torch.Generator().manual_seed(4))
        errs = {}
        for i, kind in enumerate(t.BLOCK_TYPES):
            raw = t._blocks(kind, seed=i)
            one = torch.cat([weights[kind].apply(x[j : j + 1]) for j in range(3)])
            assert torch.equal(weights[kind].apply(x), one)
            errs[kind] = t._check(one, x, t._reference(kind, raw), kind)[0]
        print(json.dumps(errs))
        """
    )
    env = dict(os.environ, WSLM_CPU_KERNELS_CFLAGS="-march=x86-64 -mtune=generic", XDG_CACHE_HOME=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", script, str(blocks_file[0]), os.path.dirname(__file__)], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    errs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(errs) == set(BLOCK_TYPES) and max(errs.values()) <= ROUNDING, errs


def test_no_mmap_reads_the_same_blocks_into_private_memory(blocks_file, weights):
    private = _loaded(blocks_file[0], use_mmap=False)
    x = torch.randn(2, COLS)
    for kind, w in private.items():
        raw = w.parts[0][1]
        assert not _mapped_from(raw.data_ptr(), blocks_file[0])  # memory of its own
        assert torch.equal(raw, weights[kind].parts[0][1])
        assert torch.equal(w.apply(x), weights[kind].apply(x))


_MEMORY = textwrap.dedent(
    """
    import ctypes, json, sys

    def anon():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024

    import torch, transformers  # noqa: F401
    from transformers import AutoConfig
    import transformers.tokenization_utils_tokenizers  # noqa: F401
    AutoConfig.for_model("llama")
    from wslm.backend import LLM, SamplingParams
    from wslm.demo import demo_model_path
    from wslm.backend.quant.gguf_file import GGUFFile

    reader = GGUFFile(demo_model_path())
    blocks = sum(t.n_bytes for t in reader.tensors if t.tensor_type.name != "F32")
    reader.close()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    base = anon()
    llm = LLM("demo", kv_cache_memory=4 << 20, max_model_len=64, max_num_seqs=1, no_mmap=sys.argv[1] == "1")
    out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    kv = llm.llm_engine.executor.kv_cache_bytes
    print(json.dumps({"private": anon() - base - kv, "blocks": blocks, "tokens": list(out[0].outputs[0].token_ids)}))
    """
)


def _load_memory(no_mmap: bool) -> dict:
    env = dict(os.environ, WSLM_GGUF_DEQUANTIZE="0", WSLM_CPU_COMPILE="0")
    proc = subprocess.run([sys.executable, "-c", _MEMORY, "1" if no_mmap else "0"], env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_mapped_load_adds_no_private_copy_of_the_weights():
    """The demo GGUF (Q4_1 layers, a Q8_0 table): its blocks stay pages of the mapped file, so the load's
    private (anonymous) memory beyond the KV pool is the tokenizer, the model's small tensors and buffers,
    not the weights; LLM(no_mmap=True) (`--no-mmap`) reads them into private memory and decodes the same
    tokens."""
    mapped = _load_memory(False)
    private = _load_memory(True)
    print(mapped["private"] >> 20, private["private"] >> 20, mapped["blocks"] >> 20)
    assert mapped["private"] < 0.5 * mapped["blocks"], mapped
    assert private["private"] - mapped["private"] >= 0.9 * mapped["blocks"], (mapped, private)
    assert private["tokens"] == mapped["tokens"]


def test_compiled_batch_graph_takes_the_repacked_form(weights):
    """The compiled batch graph freezes a copy of its weights anyway: blocks hand it the repacked form the
    loader gave before (kernel().repacked), made once and kept, so the graph's buffers are that one copy."""
    from wslm.backend.platforms.cpu.decode_compiled import _weight_spec
    from wslm.backend.quant.linear import finalize

    for kind in ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"):
        w = weights[kind]
        k = w.kernel()
        assert k.layout == "gguf" and k.buffers["blocks"] is w.c_struct()
        spec = _weight_spec(w)
        legacy = finalize(w.legacy(), torch.device("cpu"), torch.bfloat16)
        expected = _weight_spec(legacy)
        assert spec is not None and spec[0] == expected[0] == legacy.kernel().layout, kind
        assert _weight_spec(w)[1][0] is spec[1][0]  # made once: the same tensors on every call
