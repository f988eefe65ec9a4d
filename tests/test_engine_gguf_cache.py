"""A GGUF model's tokenizer and config are converted once and read from the copy after; its weights are
read from the GGUF itself (kept quantized), never copied."""

import os

from wslm.backend import LLM, SamplingParams
from wslm.backend.loader import gguf_cache
from wslm.demo import demo_model_path

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def test_demo_gguf_converted_once_then_loaded_from_the_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("WSLM_CACHE_DIR", str(tmp_path))
    params = SamplingParams(temperature=0, max_tokens=10)
    first = LLM("demo", dtype="bfloat16", kv_cache_memory=32 << 20, max_model_len=256)
    folder = gguf_cache.folder_for(demo_model_path())
    assert folder.parent == tmp_path / "gguf"
    assert gguf_cache.has_tokenizer_and_config(folder)
    assert not list(folder.glob("*.safetensors"))  # no dequantized copy of the weights
    expected = first.chat(CHAT, params)[0].outputs[0].token_ids
    del first
    stamp = (folder / "config.json").stat().st_mtime_ns
    second = LLM("demo", dtype="bfloat16", kv_cache_memory=32 << 20, max_model_len=256)
    assert (folder / "config.json").stat().st_mtime_ns == stamp  # read, not rewritten
    assert second.chat(CHAT, params)[0].outputs[0].token_ids == expected
    assert not [p for p in folder.parent.iterdir() if ".tmp" in p.name]


def test_cache_key_follows_the_file_and_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv("WSLM_CACHE_DIR", str(tmp_path))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + b"\0" * 16)
    before = gguf_cache.folder_for(f)
    os.utime(f, ns=(1, 1))
    assert gguf_cache.folder_for(f) != before  # a replaced file is converted again
    assert gguf_cache.enabled()
    monkeypatch.setenv("WSLM_GGUF_CACHE", "0")
    assert not gguf_cache.enabled()
