"""LoRA adapters (PEFT's folder format, written here): merged as the model loads, the engine decodes what
transformers decodes with the same adapter merged (W + alpha/r * B @ A on every projection); `wslm serve
--enable-lora --lora-modules NAME=PATH` serves the adapter by name beside the base model, through the
official openai client; bad adapters are start-up errors that name the cause."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
import torch
from engine_helpers import hf_greedy
from test_server_helpers import ServerProcess

from wslm.backend import LLM, SamplingParams

TARGETS = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}
RANK, ALPHA = 8, 16
PROMPT = "The quick brown fox"


def write_adapter(folder: Path, hf_model, rank: int = RANK, seed: int = 0) -> dict[str, torch.Tensor]:
    """A PEFT LoRA folder for hf_model's architecture: random A and B on every projection. Returns
    {module name: delta} (what merging adds to that module's weight)."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    tensors, deltas = {}, {}
    for i, layer in enumerate(hf_model.model.layers):
        for block, names in TARGETS.items():
            for name in names:
                weight = getattr(getattr(layer, block), name).weight
                a = torch.randn(rank, weight.shape[1], generator=gen) * 0.2
                b = torch.randn(weight.shape[0], rank, generator=gen) * 0.2
                key = f"base_model.model.model.layers.{i}.{block}.{name}"
                tensors[f"{key}.lora_A.weight"], tensors[f"{key}.lora_B.weight"] = a, b
                deltas[f"model.layers.{i}.{block}.{name}"] = (b @ a) * (ALPHA / rank)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": ALPHA, "target_modules": [n for ns in TARGETS.values() for n in ns],
        "base_model_name_or_path": "tiny", "bias": "none", "task_type": "CAUSAL_LM",
    }))  # fmt: skip
    return deltas


@pytest.fixture(scope="module")
def tiny(tiny_models, tmp_path_factory):
    """The tiny llama folder, its tokenizer, the greedy tokens of transformers with the adapter merged and
    without, and the adapter's folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tiny_models["llama"]
    tok = AutoTokenizer.from_pretrained(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    ids = tok.encode(PROMPT)
    base = hf_greedy(hf, tok, ids, 16)
    adapter = tmp_path_factory.mktemp("lora") / "sql"
    deltas = write_adapter(adapter, hf)
    with torch.no_grad():
        for name, delta in deltas.items():
            hf.get_submodule(name).weight.add_(delta)
    merged = hf_greedy(hf, tok, ids, 16)
    assert merged != base  # the adapter changes what the model says
    return folder, ids, base, merged, adapter


def test_merged_adapter_decodes_what_transformers_does(tiny):
    folder, ids, base, merged, adapter = tiny
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    kw = dict(kv_cache_memory=16 << 20, dtype="float32")
    llm = LLM(str(folder), lora_path=str(adapter), **kw)
    assert llm.generate([{"prompt_token_ids": ids}], greedy)[0].outputs[0].token_ids == merged


def test_bad_adapters_name_the_cause(tiny, tmp_path):
    from wslm.backend.loader.lora import check_adapter, merge_lora

    folder, *_, adapter = tiny
    with pytest.raises(ValueError, match="no adapter_config.json"):
        check_adapter(tmp_path, 16)
    with pytest.raises(ValueError, match="above --max-lora-rank 4; raise --max-lora-rank to 8"):
        check_adapter(adapter, 4)
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    with pytest.raises(ValueError, match="no adapter_model.safetensors"):
        check_adapter(tmp_path, 16)

    class Int8:  # a layer whose weight is held quantized
        weight = object()

    class Block:
        qkv_proj = o_proj = gate_up_proj = down_proj = Int8()

    class Layer:
        self_attn = mlp = Block()

    class Model:
        layers = [Layer(), Layer()]

    with pytest.raises(ValueError, match="keeps its weights quantized.*16-bit checkpoint"):
        merge_lora(Model(), adapter)


def test_serve_answers_for_the_adapter_and_the_base_by_name(tiny, tmp_path):
    folder, ids, base, merged, adapter = tiny
    srv = ServerProcess("--model", str(folder), "--port", "0", "--served-model-name", "base", "--dtype", "float32",
                        "--kv-cache-memory", "16MiB", "--enable-lora", "--lora-modules", f"sql={adapter}",
                        json.dumps({"name": "sql2", "path": str(adapter)}), "--max-loaded-models", "3")  # fmt: skip
    try:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
        cards = {m.id: m for m in client.models.list().data}
        assert set(cards) == {"base", "sql", "sql2"}
        assert cards["sql"].model_extra["parent"] == "base" and cards["sql"].model_extra["root"] == str(adapter)
        for model, want in (("sql", merged), ("base", base), ("sql2", merged)):
            r = client.completions.create(model=model, prompt=ids, max_tokens=16, temperature=0,
                                          extra_body={"ignore_eos": True, "return_token_ids": True})
            assert r.model == model and r.choices[0].token_ids == want, model
    finally:
        srv.stop()
    # Refused before anything loads, in one line naming the cause.
    for extra, words in (([f"sql={tmp_path}"], "no adapter_config.json"),
                         ([f"sql={adapter}", "--max-lora-rank", "4"], "--max-lora-rank"),
                         (["sql"], "NAME=PATH")):  # fmt: skip
        bad = ServerProcess("--model", str(folder), "--port", "0", "--lora-modules", *extra, wait=False)
        event = bad.wait_event(("ready", "error"), 120)
        assert bad.proc.wait(60) != 0 and event["event"] == "error" and words in event["message"], event
