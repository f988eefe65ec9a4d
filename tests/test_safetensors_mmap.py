"""Safetensors folders load memory-mapped: weights used as stored (the model's dtype, no transform) are views of
the mapped file, so a load's resident growth is the file's pages (shared with the page cache), not private
copies; --no-mmap (`LLM(no_mmap=True)`) reads private copies, and the same tokens come out.

Measured in child processes (a fresh address space each): the private (anonymous) memory load_model adds, over
a baseline with the tokenizer and config already read."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent(
    """
    import ctypes, json, logging, sys

    import torch
    from wslm.backend import LLM
    from wslm.backend.loader.model_loader import load_model_config, load_tokenizer
    from wslm.backend.loader.model_source import resolve_model
    from wslm.backend.sampling_params import SamplingParams
    from wslm.backend.worker.model_runner import load_model

    folder, no_mmap = sys.argv[1], sys.argv[2] == "1"
    logging.basicConfig(level=logging.INFO)

    def anon():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024

    source = resolve_model(folder)
    tok = load_tokenizer(source)
    _, mc = load_model_config(source, tok, "bfloat16", torch.device("cpu"))
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    before = anon()
    model = load_model(source, mc, torch.device("cpu"), no_mmap=no_mmap)
    grown = anon() - before
    gate_up = model.layers[0].mlp.gate_up_proj.weight
    del model
    llm = LLM(folder, dtype="bfloat16", kv_cache_memory=8 << 20, max_model_len=128, max_num_seqs=2,
              no_mmap=no_mmap, enforce_eager=True)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": [5, 17, 42, 99, 3]}], params)
    print(json.dumps({"private": grown, "tokens": list(out[0].outputs[0].token_ids),
                      "gate_up_shape": list(gate_up.shape)}))
    """
)


def _tiny_bf16_llama(folder: Path) -> Path:
    """A 6-layer random Llama saved by transformers in bfloat16 (~37 MB), with a small word-level tokenizer."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 1024)}}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1024, hidden_size=512, intermediate_size=1536, num_hidden_layers=6,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256,
                         initializer_range=0.2, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _load(folder: Path, no_mmap: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), WSLM_CPU_COMPILE="0")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(folder), "1" if no_mmap else "0"], env=env,
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "log": proc.stderr}


@pytest.mark.timeout(600)
def test_mapped_load_is_file_pages_and_no_mmap_gives_the_same_tokens(tmp_path):
    if not os.path.exists("/proc/self/status"):
        pytest.skip("needs Linux's /proc/self/status (RssAnon)")
    folder = _tiny_bf16_llama(tmp_path / "tiny-bf16")
    size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    mapped, copied = _load(folder, no_mmap=False), _load(folder, no_mmap=True)
    print({"file": size, "mapped": mapped["private"], "copied": copied["private"]})
    # Mapped: only what is transformed is private (q|k|v fused: ~13% of this file; gate|up lie one after the
    # other in the file and fuse as a view), plus small buffers.
    assert mapped["private"] < 0.3 * size, (mapped, size)
    # --no-mmap: every weight a private copy (the measurement sees them).
    assert copied["private"] > 0.9 * size, (copied, size)
    assert mapped["gate_up_shape"] == copied["gate_up_shape"] == [2 * 1536, 512]
    assert mapped["tokens"] == copied["tokens"] and len(mapped["tokens"]) == 12
    # Load progress counts the file's tensor bytes, to 100%.
    total = sum(int(n) for n in _stored(folder))
    mb = f"{total / 1e6:.0f}"
    assert re.search(rf"Loading weights of \S*tiny-bf16: 100% \({mb} of {mb} MB, \d+ MB/s\)", mapped["log"]), mapped["log"]


def _stored(folder: Path):
    from wslm.backend.loader.safetensors_mmap import stored_bytes

    for file in folder.glob("*.safetensors"):
        yield from stored_bytes(file).values()


def test_adjacent_parts_fuse_as_a_view_and_others_are_copied():
    import torch

    from wslm.backend.modeling.layers.linear import adjacent_view

    whole = torch.arange(24, dtype=torch.float32)
    a, b = whole[:12].view(3, 4), whole[12:].view(3, 4)
    fused = adjacent_view([a, b])
    assert fused is not None and fused.data_ptr() == a.data_ptr() and torch.equal(fused, torch.cat([a, b]))
    assert adjacent_view([b, a]) is None  # out of order
    assert adjacent_view([a, b.clone()]) is None  # another storage
    assert adjacent_view([whole[:8].view(2, 4), whole[12:].view(3, 4)]) is None  # a gap between them


def test_mapped_tensors_equal_safetensors_own(tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    from wslm.backend.loader.safetensors_mmap import iter_mapped, stored_bytes

    tensors = {"a": torch.randn(3, 5, dtype=torch.bfloat16), "b": torch.arange(7, dtype=torch.int64),
               "c": torch.randn(2, 2, dtype=torch.float16), "empty": torch.zeros(0, 4)}
    path = tmp_path / "x.safetensors"
    save_file(tensors, str(path))
    mapped = dict(iter_mapped(path))
    own = load_file(str(path))
    assert mapped.keys() == own.keys()
    for name, t in own.items():
        assert mapped[name].dtype == t.dtype and torch.equal(mapped[name], t), name
    assert stored_bytes(path) == {n: t.numel() * t.element_size() for n, t in tensors.items()}
    mapped["a"].add_(1)  # copy-on-write: the file keeps its values
    assert torch.equal(load_file(str(path))["a"], tensors["a"])


def test_a_file_cut_short_is_a_clear_error(tmp_path):
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    from wslm.backend.loader.safetensors_mmap import iter_mapped

    path = tmp_path / "x.safetensors"
    save_file({"a": torch.zeros(64, 64)}, str(path))
    whole = path.read_bytes()
    for cut in (40, len(whole) - 100):  # inside the header; inside the tensor data
        path.write_bytes(whole[:cut])
        with pytest.raises(SafetensorError, match="Download the model again"):
            list(iter_mapped(path))
