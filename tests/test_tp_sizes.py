"""The tensor-parallel sizes offered (GUI server panel, `wslm doctor`) are the sizes the engine accepts: one
rule, wslm.tp_sizes, fed by the engine's model config on one side and `wslm models info --json` on the other."""

from __future__ import annotations

import json

import pytest

from wslm.backend.quant.registry import checkpoint_group
from wslm.tp_sizes import model_facts, refusal, tensor_parallel_sizes


def test_every_mlp_width_must_split():
    dense = dict(num_heads=8, num_kv_heads=2, intermediate_size=256)
    assert tensor_parallel_sizes(8, **dense) == [1, 2, 4, 8]  # 2 KV heads replicated over 4 and 8 ranks
    assert tensor_parallel_sizes(8, **dense, moe_intermediate_size=20) == [1, 2, 4]  # experts' width
    assert tensor_parallel_sizes(8, **dense, moe_intermediate_size=24, shared_expert_intermediate_size=6) == [1, 2]
    assert refusal(8, **dense, moe_intermediate_size=20) == "MLP widths 256, 20"
    assert refusal(3, 9, 3, 1536) == "" and refusal(2, 9, 3, 1536) == "9 attention heads"  # the demo model


def test_each_rank_must_hold_whole_4bit_groups():
    shape = dict(num_heads=8, num_kv_heads=2, head_dim=16, intermediate_size=256)  # o_proj input: 128 columns
    assert tensor_parallel_sizes(8, **shape) == [1, 2, 4, 8]
    assert tensor_parallel_sizes(8, **shape, quant_group_size=32) == [1, 2, 4]  # 8 ranks: 16 of o's columns
    assert "4-bit groups of 32 columns" in refusal(8, **shape, quant_group_size=32)
    # Routed experts and the shared expert stay quantized: their down projections hold whole groups too.
    assert tensor_parallel_sizes(8, **shape, quant_group_size=32, moe_intermediate_size=16) == [1]
    assert tensor_parallel_sizes(8, **shape, quant_group_size=32, moe_intermediate_size=768) == [1, 2, 4]
    assert tensor_parallel_sizes(8, **shape, quant_group_size=32, shared_expert_intermediate_size=64) == [1, 2]
    assert tensor_parallel_sizes(4, num_heads=4, head_dim=20, quant_group_size=128) == [1]  # one rank: all whole


def test_group_sizes_and_model_json_facts():
    # Each format answers its own group width (QuantMethod.group_size); the registry asks it by name.
    assert checkpoint_group("gguf") == 32 and checkpoint_group("awq", {"group_size": 64}) == 64
    assert checkpoint_group("awq", {"q_group_size": 32}) == 32 and checkpoint_group("gptq", {}) == 128
    assert checkpoint_group("int4") is None and checkpoint_group(None) is None
    info = {"id": "x", "num_attention_heads": 8, "num_kv_heads": 2, "head_dim": None, "quant_group_size": 32}
    assert model_facts(info) == {"num_heads": 8, "num_kv_heads": 2, "quant_group_size": 32}
    assert model_facts(None) == {} and tensor_parallel_sizes(3, **model_facts(None)) == [1, 2, 3]


def test_gguf_metadata_gives_the_widths_and_groups(tmp_path, monkeypatch):
    from hub_server import make_tiny_gguf

    from wslm.backend.hub.metadata import read_gguf

    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    meta = read_gguf(make_tiny_gguf(tmp_path / "moe.gguf", ffn=96, expert_ffn=20))
    assert (meta.intermediate_size, meta.moe_intermediate_size, meta.quant_group_size) == (96, 20, 32)
    # 4 heads of 16: 2 ranks would hold 48 of the MLP's 96 columns, one and a half groups of 32.
    assert tensor_parallel_sizes(4, **model_facts(vars(meta))) == [1]
    assert tensor_parallel_sizes(4, **model_facts({**vars(meta), "quant_group_size": None})) == [1, 2, 4]


def _write_configs(root):
    """config.json as transformers writes it: a tiny Qwen2-MoE (experts 20 wide) and an AWQ Llama
    (groups of 32); no weights are needed to list them or to check a size."""
    import transformers as tf

    small = dict(hidden_size=128, num_attention_heads=8, num_key_value_heads=2, num_hidden_layers=2,
                 intermediate_size=256, vocab_size=256)  # fmt: skip
    tf.Qwen2MoeConfig(**small, moe_intermediate_size=20, shared_expert_intermediate_size=48, num_experts=4,
                      num_experts_per_tok=2, architectures=["Qwen2MoeForCausalLM"]).save_pretrained(root / "moe")
    awq = {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"}
    tf.LlamaConfig(**small, architectures=["LlamaForCausalLM"]).save_pretrained(root / "awq")
    config = json.loads((root / "awq" / "config.json").read_text())
    (root / "awq" / "config.json").write_text(json.dumps({**config, "quantization_config": awq}))


def _engine_accepts(folder, sizes) -> list[int]:
    """The sizes the engine's start-up check lets through (the same call LLMEngine makes before any worker)."""
    import torch

    from wslm.backend.distributed.parallel_state import check_divisible
    from wslm.backend.loader.model_loader import load_model_config, resolve_model
    from wslm.backend.quant.shard import checkpoint_group_size

    source = resolve_model(str(folder), None, None)
    _, mc = load_model_config(source, None, "float32", torch.device("cpu"))
    ok = []
    for n in sizes:
        try:
            check_divisible(mc, n, checkpoint_group_size(source, mc.quantization))
            ok.append(n)
        except ValueError as exc:
            assert "Use --tensor-parallel-size" in str(exc)
    return ok


@pytest.fixture
def panel(qtbot, tmp_path, monkeypatch):
    from wslm.gui.log_model import LogModel
    from wslm.gui.server_controller import ServerController
    from wslm.gui.server_panel import ServerPanel
    from wslm.gui.settings import Settings

    monkeypatch.setenv("WSLM_CONFIG_DIR", str(tmp_path / "config"))
    p = ServerPanel(ServerController(LogModel()), Settings(first_run_done=True))
    qtbot.addWidget(p)
    return p


def test_gui_field_offers_exactly_the_sizes_the_engine_accepts(panel, tmp_path, monkeypatch, capsys):
    from wslm.cli import build_parser

    monkeypatch.setenv("WSLM_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    _write_configs(tmp_path / "models")
    infos = []
    for model_id in ("moe", "awq"):
        args = build_parser().parse_args(["models", "info", model_id, "--json"])
        assert args.func(args) == 0
        infos.append(json.loads(capsys.readouterr().out))
    panel.set_models(infos)
    panel.set_gpu_count(8)
    for info, without_the_new_facts in zip(infos, ([1, 2, 4, 8], [1, 2, 4, 8])):
        panel.set_model(info["id"])  # picking the model refills the field
        offered = [panel.tp.itemData(i) for i in range(panel.tp.count())]
        assert offered == _engine_accepts(tmp_path / "models" / info["id"], range(1, 9)) == [1, 2, 4], info["id"]
        # The facts that decide it: the experts' width, the checkpoint's 4-bit groups.
        assert tensor_parallel_sizes(8, info["num_attention_heads"], info["num_kv_heads"],
                                     info["intermediate_size"]) == without_the_new_facts  # fmt: skip
    assert infos[0]["moe_intermediate_size"] == 20 and infos[0]["shared_expert_intermediate_size"] == 48
    assert infos[1]["quant_group_size"] == 32 and infos[1]["head_dim"] == 16
