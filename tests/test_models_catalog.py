"""`wslm models list|info|rm` and resolve_model over a real models folder, HF cache and the demo model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hub_server import FakeHub, make_tiny_gguf, make_tiny_llama
from test_models_pull import env, tiny_llama, warm_metadata, wslm  # noqa: F401 - shared fixtures and runner

from wslm.backend.hub import catalog
from wslm.backend.hub.catalog import find_model, list_models, remove_model, resolve_model
from wslm.cli import build_parser

CONTRACT = {
    "id": str, "path": str, "format": str, "architecture": (str, type(None)), "num_params": (int, type(None)),
    "dtype": (str, type(None)), "quantization": (str, type(None)), "size_bytes": int,
    "context_length": (int, type(None)), "supported": bool, "memory_estimate_bytes": (int, type(None)),
    "source": str,
}  # fmt: skip


@pytest.fixture
def models_dir(env, tiny_llama) -> Path:  # noqa: F811
    root = Path(env["WSLM_MODELS_DIR"])
    shutil.copytree(tiny_llama, root / "my-llama")
    make_tiny_gguf(root / "lmstudio" / "tiny" / "tiny-Q8_0.gguf", file_type="Q8_0")
    make_tiny_gguf(root / "phi.gguf", arch="phi2", file_type="Q4_0")  # Phi-2: no GGUF support
    (root / "broken.gguf").write_bytes(b"not a gguf at all")
    (root / "notes.txt").write_text("ignored")
    return root


def run_cli(*argv: str, capsys) -> tuple[int, str]:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    rc = args.func(args)
    return rc, capsys.readouterr().out


def test_list_json_contract_and_sources(models_dir, capsys):
    rc, out = run_cli("models", "list", "--json", capsys=capsys)
    assert rc == 0 and out.count("\n") == 1
    models = {m["id"]: m for m in json.loads(out)["models"]}
    for m in models.values():
        for key, kind in CONTRACT.items():
            assert isinstance(m[key], kind), (m["id"], key, m[key])
        assert m["format"] in ("hf", "gguf") and m["source"] in ("demo", "bundled", "hf-cache", "models-dir")
        assert m["task"] in ("generate", "embed", "score")

    demo = models["demo"]
    assert demo["source"] == "demo" and demo["format"] == "gguf" and demo["supported"]
    assert demo["architecture"] == "LlamaForCausalLM" and demo["quantization"] == "Q4_1"
    assert demo["context_length"] == 8192 and 130e6 < demo["num_params"] < 140e6
    from wslm.demo import demo_model_path

    assert demo["path"] == str(demo_model_path())

    hf = models["my-llama"]
    assert hf["source"] == "models-dir" and hf["format"] == "hf" and hf["supported"]
    assert hf["dtype"] == "float32" and hf["context_length"] == 256 and hf["num_params"] > 100_000
    assert hf["size_bytes"] > 400_000

    q8 = models["lmstudio/tiny/tiny-Q8_0.gguf"]
    assert q8["quantization"] == "Q8_0" and q8["supported"] and q8["context_length"] == 512
    phi = models["phi.gguf"]
    assert not phi["supported"] and "phi2" in phi["unsupported_reason"]
    broken = models["broken.gguf"]
    assert not broken["supported"] and "not a readable GGUF" in broken["unsupported_reason"]
    assert "notes.txt" not in models


def test_memory_estimate_follows_the_context(models_dir):
    # Two sequences: the pool is their need, under the memory cap (128 sequences of 1,024 would reach it).
    small = find_model("demo", context=1024, max_num_seqs=2)
    big = find_model("demo", context=8192, max_num_seqs=2)
    from wslm.backend.platforms.cpu.kv_sizing import plan_kv_pool, runtime_value_bytes

    # K and V, 30 layers, 3 KV heads of 64, in the engine's dtype=auto here (16-bit, or fp32 on most CPUs)
    per_token = 2 * 30 * 3 * 64 * runtime_value_bytes()
    assert small.kv_bytes_per_token == per_token
    # The KV part is the pool `wslm serve` reserves by default (kv_sizing, the engine's own function): room for
    # --max-num-seqs sequences of the context, within the memory cap.
    assert big.kv_cache_bytes == plan_kv_pool(per_token, 8192, max_num_seqs=2).bytes == 2 * 8192 * per_token
    assert big.kv_cache_sized_by == "need" and big.kv_cache_max_concurrency == 2.0
    assert big.memory_estimate_bytes - small.memory_estimate_bytes == big.kv_cache_bytes - small.kv_cache_bytes > 0
    assert find_model("demo", context=10**6).estimate_context == 8192  # capped at the model's own
    # GGUF weights stay quantized (Q4_1 -> int4 groups of 32, Q8_0 -> int8): about the file's size, not 2 bytes each.
    from wslm.backend.hub.metadata import read_gguf
    from wslm.backend.quant.sizes import gguf_runtime_bytes

    assert small.weights_memory_bytes == gguf_runtime_bytes(read_gguf(Path(small.path)).elements_by_type)
    assert small.weights_memory_bytes < small.num_params


def test_human_table_and_info(models_dir, capsys):
    rc, out = run_cli("models", "list", capsys=capsys)
    assert rc == 0 and "my-llama" in out and "demo" in out and "phi.gguf" in out and "unsupported" in out
    rc, out = run_cli("models", "info", "my-llama", "--json", capsys=capsys)
    info = json.loads(out)
    assert rc == 0 and info["id"] == "my-llama" and "model.safetensors" in info["files"]
    rc, out = run_cli("models", "info", "lmstudio/tiny/tiny-Q8_0", capsys=capsys)  # .gguf may be left off
    assert rc == 0 and "Q8_0" in out and "Supported:      yes" in out
    rc, out = run_cli("models", "info", "nope", "--json", capsys=capsys)
    assert rc == 1 and json.loads(out)["error"]["code"] == "not_found"


def test_resolve_model(models_dir):
    assert resolve_model("my-llama") == models_dir / "my-llama"
    assert resolve_model("lmstudio/tiny/tiny-Q8_0.gguf") == models_dir / "lmstudio/tiny/tiny-Q8_0.gguf"
    assert resolve_model("demo").name.endswith(".gguf")
    assert resolve_model("SmolLM2-135M-Instruct") == resolve_model("demo")
    assert resolve_model("org/unknown") is None and resolve_model("") is None


def test_rm(models_dir, capsys):
    rc, out = run_cli("models", "rm", "my-llama", "--yes", "--json", capsys=capsys)
    assert rc == 0 and json.loads(out)["freed_bytes"] > 400_000
    assert not (models_dir / "my-llama").exists()
    rc, out = run_cli("models", "rm", "lmstudio/tiny/tiny-Q8_0.gguf", "--yes", capsys=capsys)
    assert rc == 0 and not (models_dir / "lmstudio/tiny/tiny-Q8_0.gguf").exists()
    rc, out = run_cli("models", "rm", "demo", "--yes", "--json", capsys=capsys)
    assert rc == 1 and "cannot be removed" in json.loads(out)["error"]["message"]
    rc, out = run_cli("models", "rm", "nope", "--yes", "--json", capsys=capsys)
    assert rc == 1 and json.loads(out)["error"]["code"] == "not_found"
    with pytest.raises(catalog.RemoveError):
        remove_model("demo")


def test_rm_asks_first(models_dir, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    rc, out = run_cli("models", "rm", "phi.gguf", capsys=capsys)
    assert rc == 2 and (models_dir / "phi.gguf").exists()
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    rc, out = run_cli("models", "rm", "phi.gguf", capsys=capsys)
    assert rc == 0 and (models_dir / "phi.gguf").exists()
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    rc, out = run_cli("models", "rm", "phi.gguf", capsys=capsys)
    assert rc == 0 and not (models_dir / "phi.gguf").exists()


def test_gguf_metadata_is_cached(models_dir, monkeypatch):
    from wslm.backend.hub import metadata

    path = models_dir / "lmstudio/tiny/tiny-Q8_0.gguf"
    first = metadata.read_gguf(path)

    def boom(p):
        raise AssertionError("read the header again")

    monkeypatch.setattr(metadata, "_read_gguf_uncached", boom)
    assert metadata.read_gguf(path) == first
    make_tiny_gguf(path, file_type="Q4_0", context=1024)  # a changed file is read again
    monkeypatch.undo()
    assert metadata.read_gguf(path).context_length == 1024


def test_unfinished_download_is_listed_resumable_and_removable(env, tiny_llama, capsys):  # noqa: F811
    from wslm.backend.hub.download import Puller, PullError

    sharded = make_tiny_llama(Path(env["HF_HOME"]) / "src", max_shard_size="200KB")
    shards = sorted(p.name for p in sharded.glob("model-*.safetensors"))
    assert len(shards) >= 2 and (sharded / "model.safetensors.index.json").exists()
    with FakeHub() as hub:
        hub.add_repo("org/tiny", sharded)
        hub.drop_at(shards[-1], 50_000)  # the first shard arrives, the last is cut short
        with pytest.raises(PullError):
            Puller("org/tiny", endpoint=hub.url, retries=0).run()
    snapshot = next((Path(env["HF_HUB_CACHE"]) / "models--org--tiny" / "snapshots").iterdir())
    assert (snapshot / shards[0]).exists() and (snapshot / "config.json").exists()
    assert resolve_model("org/tiny") is None  # never half a model
    assert "org/tiny" not in {m.id for m in list_models()}
    partial = next(m for m in list_models(include_partial=True) if m.id == "org/tiny")
    assert not partial.complete and not partial.supported and 0 < partial.partial_bytes <= 50_000
    assert partial.pull["repo"] == "org/tiny" and shards[-1] in partial.pull["files"]
    assert partial.pull["command"] == ["wslm", "models", "pull", "org/tiny", "--endpoint", hub.url]
    assert f"wslm models pull org/tiny --endpoint {hub.url}" in partial.unsupported_reason
    rc, out = run_cli("models", "list", capsys=capsys)
    assert "Unfinished download: org/tiny" in out and "--endpoint" in out
    rc, out = run_cli("models", "list", "--json", "--all", capsys=capsys)
    assert any(m["id"] == "org/tiny" and not m["complete"] for m in json.loads(out)["models"])
    rc, out = run_cli("models", "rm", "org/tiny", "--yes", capsys=capsys)
    assert rc == 0 and not (Path(env["HF_HUB_CACHE"]) / "models--org--tiny").exists()
    assert find_model("org/tiny") is None


def test_models_folder_oddities(env):  # noqa: F811
    root = Path(env["WSLM_MODELS_DIR"])
    # An LM Studio-style folder: a config.json beside the GGUF, no HF weights.
    make_tiny_gguf(root / "pub" / "repo" / "repo-Q4_K_M.gguf")
    (root / "pub" / "repo" / "config.json").write_text("{}")
    (root / "pub" / "loop").symlink_to(root / "pub")  # a link loop must not hang the scan
    ids = {m.id for m in list_models()}
    assert "pub/repo/repo-Q4_K_M.gguf" in ids and "pub/repo" not in ids


def test_windowed_models_are_estimated_with_the_pool_the_engine_reserves(tmp_path):
    """Mistral-style configs (every layer windowed) keep only window + one step per sequence; Gemma 2 and Qwen2
    (full-attention layers, or the window switched off) keep their whole context: the same rule as kv_cache.py."""
    from transformers import Gemma2Config, MistralConfig, Qwen2Config

    from wslm.backend.config import DEFAULT_MAX_NUM_BATCHED_TOKENS
    from wslm.backend.hub.metadata import read_hf_folder
    from wslm.backend.platforms.cpu.kv_sizing import kv_context

    small = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=128, max_position_embeddings=32768)
    cases = {"mistral": (MistralConfig(sliding_window=4096, **small), 4096),
             "gemma2": (Gemma2Config(sliding_window=4096, head_dim=16, **small), None),
             "qwen2": (Qwen2Config(sliding_window=4096, use_sliding_window=False, **small), None)}
    for name, (config, window) in cases.items():
        config.save_pretrained(tmp_path / name)
        meta = read_hf_folder(tmp_path / name)
        assert meta.uniform_sliding_window == window, name
    assert kv_context(32768, 4096, DEFAULT_MAX_NUM_BATCHED_TOKENS) == 4096 + DEFAULT_MAX_NUM_BATCHED_TOKENS
    assert kv_context(32768, None, DEFAULT_MAX_NUM_BATCHED_TOKENS) == 32768


def test_a_gguf_copied_into_the_models_folder_is_served_by_its_listed_name(models_dir, monkeypatch):
    """`wslm models list` shows it as folder/file.gguf; the loader (serve, Chat's picker) takes that name too,
    and a .gguf name that is neither a file nor listed still says what to check."""
    from wslm.backend.loader.model_source import resolve_model as loader_resolve

    monkeypatch.chdir(models_dir.parent)  # the name is no path from here
    source = loader_resolve("lmstudio/tiny/tiny-Q8_0.gguf")
    assert source.gguf_path == models_dir / "lmstudio/tiny/tiny-Q8_0.gguf"
    with pytest.raises(FileNotFoundError, match="no model of that name in `wslm models list`"):
        loader_resolve("mycopy/missing.Q4_1.gguf")
