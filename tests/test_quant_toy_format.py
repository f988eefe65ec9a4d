"""A weight format registered from one file (tests/toy_format.py, through the public register_method) loads
and serves like a built-in one: LLM() generates with its weights kept in its own form, and `wslm serve
--quantization int8-rowmax` split over two ranks answers a chat through the official openai client with the
tokens of the same model's dequantized (dense) weights (issue 36, "each weight format is one file")."""

from __future__ import annotations

import os
from pathlib import Path

import openai
import pytest
import torch
from test_server_helpers import ServerProcess

from wslm.backend.quant import QUANTIZATION_METHODS, check_quantization
from wslm.backend.quant.registry import (
    detect_method,
    quantization_options,
    register_method,
    unregister_method,
    weight_kind,
)

TESTS = Path(__file__).resolve().parent
PROMPT = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module", autouse=True)
def toy_format():
    """The toy module, registered for this file's tests only (other files see the built-in formats)."""
    import toy_format as module

    register_method(module.METHOD, {module.NAME: module.RowmaxWeight}, replace=True)  # again, after a previous file
    yield module
    unregister_method(module.NAME)


@pytest.fixture(scope="module")
def checkpoints(toy_format, tiny_models, tmp_path_factory):
    """(toy, dense): the tiny Llama in the toy format, and the same values dequantized to a dense folder."""
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("toy")
    toy = toy_format.write_checkpoint(tiny_models["llama"], root / "toy")
    dense = root / "dense"
    import shutil

    shutil.copytree(tiny_models["llama"], dense)
    for file in dense.glob("*.safetensors"):
        stored = load_file(str(toy / file.name))
        out = {}
        for name, t in stored.items():
            if name.endswith("_scale"):
                continue
            scale = stored.get(name + "_scale")
            out[name] = t if scale is None else toy_format.RowmaxWeight(t, scale).dequantize(torch.float32)
        save_file(out, str(file), metadata={"format": "pt"})
    return toy, dense


@pytest.fixture(scope="module")
def dense_tokens(checkpoints):
    """Greedy tokens of the dense (dequantized) model for the chat prompt, and its tokenizer's text."""
    from wslm.backend import LLM, SamplingParams

    llm = LLM(str(checkpoints[1]), dtype="float32", kv_cache_memory=64 << 20, max_model_len=256)
    out = llm.chat(PROMPT, SamplingParams(max_tokens=12, temperature=0))[0].outputs[0]
    ids, text = list(out.token_ids), out.text
    llm.llm_engine.shutdown() if hasattr(llm.llm_engine, "shutdown") else None
    del llm
    return ids, text


def test_registered_from_one_file(toy_format):
    assert "int8-rowmax" in QUANTIZATION_METHODS and check_quantization("int8-rowmax") == "int8-rowmax"
    method = detect_method({"quant_method": "int8-rowmax", "bits": 8})
    assert method is toy_format.METHOD
    assert {"value": "int8-rowmax", "label": "int8 rowmax (toy)"} in quantization_options(method)
    import argparse

    from wslm.backend.config import EngineConfig
    from wslm.backend.entrypoints.cli.engine_flags import add_engine_flags, given

    parser = argparse.ArgumentParser()
    add_engine_flags({}, parser)  # `wslm serve`'s flags: --quantization's choices are the registry's
    assert given(parser.parse_args(["--quantization", "int8-rowmax"]))["quantization"] == "int8-rowmax"
    assert EngineConfig(quantization="int8-rowmax").quantization == "int8-rowmax"


def test_llm_generates_in_the_format(checkpoints, dense_tokens):
    from wslm.backend import LLM, SamplingParams

    llm = LLM(str(checkpoints[0]), dtype="float32", kv_cache_memory=64 << 20, max_model_len=256)
    model = llm.llm_engine.executor.runner.model
    layer = model.layers[0]
    # Its linears stay in the toy's own form (q|k|v fused by its own fuse), multiplied by its own apply.
    for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
        assert weight_kind(linear.weight) == "int8-rowmax", linear
    assert llm.llm_engine.model_config.quantization == "int8-rowmax"
    out = llm.chat(PROMPT, SamplingParams(max_tokens=12, temperature=0))[0].outputs[0]
    assert list(out.token_ids) == dense_tokens[0]


def test_serve_answers_a_chat(checkpoints, dense_tokens):
    # Split over two CPU ranks: each worker process imports the format too (WSLM_QUANT_MODULES names the
    # module), and its weights shard themselves (RowmaxWeight.shard).
    env = {"WSLM_QUANT_MODULES": "toy_format",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    srv = ServerProcess("--port", "0", "--model", str(checkpoints[0]), "--quantization", "int8-rowmax",
                        "--dtype", "float32", "--served-model-name", "toy", "--max-model-len", "256", "-tp", "2",
                        "--kv-cache-memory", "64MiB", "--uvicorn-log-level", "warning", env=env)
    try:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
        r = client.chat.completions.create(model="toy", messages=PROMPT, max_tokens=12, temperature=0)
        assert r.choices[0].message.content == dense_tokens[1]
        assert r.usage.completion_tokens == len(dense_tokens[0])
    finally:
        srv.stop()


def test_models_list_and_the_gui_offer_it(checkpoints, tmp_path):
    """`wslm models list` describes the toy checkpoint through its format (runnable, its options), and the
    GUI's Quantization field offers and checks what the entry lists."""
    from wslm.backend.hub.catalog import list_models
    from wslm.gui.engine_options import check_quantization as gui_check
    from wslm.gui.engine_options import quantization_choices

    info = next(m for m in list_models(cache_dir=tmp_path, models_root=checkpoints[0].parent) if m.id == "toy")
    entry = info.to_dict()
    assert info.supported and info.quantization == "int8-rowmax-8bit", info.unsupported_reason
    assert [o["value"] for o in entry["quantization_options"]] == ["", "int8-rowmax"]
    assert ("int8 rowmax (toy)", "int8-rowmax") in quantization_choices([entry])
    assert gui_check("int8-rowmax", entry) == "" and gui_check("", entry) == ""
    assert "pick auto or int8 rowmax (toy)" in gui_check("int4", entry)
