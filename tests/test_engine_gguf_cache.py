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


def test_meta_reader_gives_transformers_what_gguf_py_gives(tmp_path):
    """The conversion child reads metadata with gguf_meta_reader (no numpy view per vocabulary entry): every
    field parses through transformers' own _gguf_parse_value to what gguf.GGUFReader's fields give, for every
    value type, and the tensors' names match."""
    import gguf
    import numpy as np
    from transformers.integrations.ggml import _gguf_parse_value

    from wslm.backend.loader.gguf_meta_reader import GGUFMetaReader

    path = tmp_path / "meta.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("general.name", "tiny ünïcode ✓")
    w.add_uint32("llama.block_count", 2)
    w.add_int32("t.i32", -5)
    w.add_uint64("t.u64", 2**40)
    w.add_int64("t.i64", -(2**40))
    w.add_float32("llama.rope.freq_base", 10000.5)
    w.add_float64("t.f64", 1.25)
    w.add_bool("t.bool", True)
    w.add_uint8("t.u8", 7)
    w.add_int8("t.i8", -7)
    w.add_uint16("t.u16", 700)
    w.add_int16("t.i16", -700)
    w.add_array("tokenizer.ggml.tokens", ["<s>", "a", "ĠHello", "✓", ""])
    w.add_array("tokenizer.ggml.merges", ["Ġ H", "e l"])
    w.add_array("tokenizer.ggml.token_type", [3, 1, 1, 1, 1])
    w.add_array("tokenizer.ggml.scores", [0.0, -1.5, -2.25, 3.0, 0.5])
    w.add_array("t.bools", [True, False])
    w.add_tensor("token_embd.weight", np.zeros((5, 4), dtype=np.float32))
    w.add_tensor("blk.0.attn_q.weight", np.ones((4, 4), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    ours, theirs = GGUFMetaReader(path), gguf.GGUFReader(path)
    assert list(ours.fields) == list(theirs.fields)
    for key, field in theirs.fields.items():
        mine = ours.fields[key]
        assert mine.types == list(field.types), key
        expected = [_gguf_parse_value(field.parts[i], field.types) for i in field.data]
        assert [_gguf_parse_value(mine.parts[i], mine.types) for i in mine.data] == expected, key
    assert [(t.name, tuple(t.shape)) for t in ours.tensors] == [(t.name, tuple(t.shape)) for t in theirs.tensors]


def test_converted_tokenizer_loads_as_autotokenizer_chose_it(tmp_path, monkeypatch):
    """The first load of a converted copy asks AutoTokenizer and notes the class it chose; a later load of a
    plain TokenizersBackend takes that class straight away (no config read) and tokenizes and renders chats
    the same."""
    from transformers import AutoTokenizer

    from wslm.backend.loader.model_loader import TOKENIZER_CLASS_FILE, load_tokenizer
    from wslm.backend.loader.model_source import resolve_model

    monkeypatch.setenv("WSLM_CACHE_DIR", str(tmp_path))
    source = resolve_model("demo")
    first = load_tokenizer(source)
    folder = gguf_cache.folder_for(demo_model_path())
    from importlib.metadata import version

    assert (folder / TOKENIZER_CLASS_FILE).read_text() == f"TokenizersBackend {version('transformers')}"
    assert type(first).__name__ == "TokenizersBackend"
    second = load_tokenizer(source)
    auto = AutoTokenizer.from_pretrained(str(folder))
    text = "Hello <|im_start|>user\nwhat is 12345? déjà vu 你好 🐱<|im_end|>"
    for tok in (second, auto):
        assert type(tok) is type(first)
        assert tok(text).input_ids == first(text).input_ids
        assert tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True) == \
            first.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)  # fmt: skip
        assert (tok.eos_token_id, tok.bos_token_id, tok.all_special_ids) == \
            (first.eos_token_id, first.bos_token_id, first.all_special_ids)  # fmt: skip
    (folder / TOKENIZER_CLASS_FILE).write_text("SomeOtherTokenizer")  # a class chosen otherwise: AutoTokenizer
    assert load_tokenizer(source)(text).input_ids == first(text).input_ids
    (folder / TOKENIZER_CLASS_FILE).write_text("TokenizersBackend 0.0.1")  # chosen by another transformers: asked
    assert load_tokenizer(source)(text).input_ids == first(text).input_ids  # again, and noted for this one
    assert (folder / TOKENIZER_CLASS_FILE).read_text() == f"TokenizersBackend {version('transformers')}"


def test_config_fields_noted_once_then_read_without_the_family_class(tmp_path, monkeypatch):
    """The first load of a converted copy resolves its config with the family's class and notes every field;
    a later load builds a plain PretrainedConfig of them (no family import) and the engine's ModelConfig is
    the same. A note from another transformers, or an unreadable one, is asked again."""
    import json
    from importlib.metadata import version

    import torch

    from wslm.backend.loader.model_loader import (
        CONFIG_FIELDS_FILE,
        _converted_config,
        load_model_config,
        load_tokenizer,
    )
    from wslm.backend.loader.model_source import resolve_model

    monkeypatch.setenv("WSLM_CACHE_DIR", str(tmp_path))
    source = resolve_model("demo")
    tok = load_tokenizer(source)
    folder = gguf_cache.folder_for(demo_model_path())
    real, first = load_model_config(source, tok, "float32", torch.device("cpu"))
    note = json.loads((folder / CONFIG_FIELDS_FILE).read_text())
    assert (note["transformers"], note["class"]) == (version("transformers"), type(real).__name__)
    plain, second = load_model_config(source, tok, "float32", torch.device("cpu"))
    assert type(plain).__name__ in ("PretrainedConfig", "PreTrainedConfig")  # v5 renamed it
    assert second == first
    for bad in ({**note, "transformers": "0.0.1"}, "{not json"):
        (folder / CONFIG_FIELDS_FILE).write_text(bad if isinstance(bad, str) else json.dumps(bad))
        assert type(_converted_config(folder)) is type(real)  # asked the class again, and noted anew
        assert json.loads((folder / CONFIG_FIELDS_FILE).read_text())["transformers"] == version("transformers")


def test_noted_config_fields_give_every_family_the_attributes_its_class_does():
    """For each family a GGUF can be, the noted fields rebuild what its config class resolves (defaults,
    derived fields, aliases such as Qwen3-MoE's num_experts), but for class-level plans the engine never reads."""
    from transformers import CONFIG_MAPPING
    from transformers.configuration_utils import PretrainedConfig

    from wslm.backend.modeling import GGUF_ARCHITECTURES

    class_only = {"base_model_pp_plan", "base_model_tp_plan", "base_model_ep_plan", "per_layer_config",
                  "transformers_version", "use_cache", "attribute_map", "default_theta"}  # fmt: skip
    types = {"qwen3moe": "qwen3_moe", "qwen2moe": "qwen2_moe", "gemma3": "gemma3_text"}
    for gguf_type in GGUF_ARCHITECTURES:
        cls = CONFIG_MAPPING[types.get(gguf_type, gguf_type)]
        real = cls()
        assert not cls.sub_configs, cls  # nested configs are never noted (model_loader._converted_config)
        fields = real.to_dict()
        for alias, target in (cls.attribute_map or {}).items():
            fields.setdefault(alias, fields.get(target))
        plain = PretrainedConfig(**fields)
        for name in dir(real):
            if name.startswith("_") or name in class_only:
                continue
            value = getattr(real, name)
            if not callable(value):
                assert getattr(plain, name) == value, (gguf_type, name)


def test_a_mapped_gguf_is_read_ahead_in_the_background(tmp_path, monkeypatch, caplog):
    """After a GGUF loads mapped, a background thread reads the file once (its pages in the page cache before a
    request needs them); WSLM_GGUF_PREFETCH=0 or a file larger than the memory available skips it."""
    import logging
    import threading

    from wslm.backend.quant import gguf_weights

    started: list[threading.Thread] = []
    real = gguf_weights.prefetch
    monkeypatch.setattr(gguf_weights, "prefetch", lambda path, **kw: started.append(real(path, **kw)) or started[-1])
    monkeypatch.setenv("WSLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("WSLM_GGUF_DEQUANTIZE", "0")
    with caplog.at_level(logging.DEBUG, logger="wslm.backend.quant.gguf_weights"):
        LLM("demo", dtype="bfloat16", kv_cache_memory=32 << 20, max_model_len=256)
        assert len(started) == 1 and started[0] is not None
        started[0].join(30)
    assert not started[0].is_alive()
    assert any("read into the page cache" in r.getMessage() for r in caplog.records)
    monkeypatch.setattr(gguf_weights, "_mem_available", lambda: 1 << 20)  # 1 MiB free: not read ahead
    assert real(demo_model_path()) is None
    started.clear()
    monkeypatch.setenv("WSLM_GGUF_PREFETCH", "0")
    LLM("demo", dtype="bfloat16", kv_cache_memory=32 << 20, max_model_len=256)
    assert started == []
