"""LoRA adapters per request over one shared base (wslm/backend/lora): a batch mixing 4 adapters and the base
gives each request exactly the greedy tokens of its adapter merged into the weights (the loader's merge math,
float32, a tiny random Llama and PEFT folders written here); the adapters take their own bytes beside one base;
prefix caching never shares KV between adapters; the server's --lora-modules, /v1/load_lora_adapter,
/v1/unload_lora_adapter and /v1/models through the official openai client."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import torch
from lora_helpers import write_adapter
from test_server_helpers import ServerProcess

from wslm.backend import LLM, LoRARequest, SamplingParams

PROMPTS = ["The quick brown fox", "Once upon a time", "Hello there", "A B C D", "Paris is", "The quick brown fox",
           "Once upon a time", "zzz top"]
# rank, targets (None: all seven projections), rslora
SPECS = [(8, None, False), (4, ("q_proj", "v_proj"), False), (16, ("gate_proj", "up_proj", "down_proj", "o_proj"), True),
         (2, ("k_proj", "down_proj"), False)]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
KW = dict(kv_cache_memory=16 << 20, dtype="float32")


def _runner(llm):
    return llm.llm_engine.core.executor.runner


@pytest.fixture(scope="module")
def setup(tiny_models, tmp_path_factory):
    """The tiny llama, 4 adapters (and their tensor bytes), and each adapter's greedy tokens for PROMPTS with
    it merged into the weights by loader/lora.py (one engine, weights restored between adapters)."""
    from wslm.backend.loader.lora import merge_lora

    folder = tiny_models["llama"]
    config = json.loads((folder / "config.json").read_text())
    root = tmp_path_factory.mktemp("adapters")
    paths, sizes = [], []
    for i, (rank, targets, rslora) in enumerate(SPECS):
        paths.append(root / f"a{i}")
        sizes.append(write_adapter(paths[-1], config, rank, seed=10 + i, rslora=rslora,
                                   **({"targets": targets} if targets else {})))
    write_adapter(root / "big", config, 32, seed=99)
    ref = LLM(str(folder), enable_prefix_caching=False, **KW)
    runner = _runner(ref)
    saved = {k: t.clone() for k, t in _weights(runner.model).items()}
    merged = {None: [o.outputs[0].token_ids for o in ref.generate(PROMPTS, GREEDY)]}
    for i, path in enumerate(paths):
        merge_lora(runner.model, path)
        runner.weights_updated()
        merged[i] = [o.outputs[0].token_ids for o in ref.generate(PROMPTS, GREEDY)]
        for k, t in _weights(runner.model).items():
            t.copy_(saved[k])
        runner.weights_updated()
    assert len({tuple(map(tuple, v)) for v in merged.values()}) == 5  # every adapter changes the answers
    del ref
    return folder, config, paths, sizes, merged, root


def _weights(model) -> dict[str, torch.Tensor]:
    return {f"{i}.{n}": getattr(getattr(layer, b), n).weight for i, layer in enumerate(model.layers)
            for b, names in (("self_attn", ("qkv_proj", "o_proj")), ("mlp", ("gate_up_proj", "down_proj")))
            for n in names}


@pytest.fixture(scope="module")
def llm(setup):
    return LLM(str(setup[0]), enable_lora=True, max_loras=4, max_lora_rank=16, **KW)


def _requests(paths) -> list[LoRARequest]:
    return [LoRARequest(f"a{i}", i + 1, str(p)) for i, p in enumerate(paths)]


def test_a_batch_mixing_four_adapters_and_the_base_gives_each_its_merged_tokens(setup, llm):
    _, _, paths, sizes, merged, _ = setup
    reqs = _requests(paths)
    # Same adapter at batch rows 0 and 5: its rows are not contiguous (the index path), others are.
    assign = [0, 1, None, 2, 3, 0, None, 1]
    outs = llm.generate(PROMPTS, GREEDY, lora_request=[None if a is None else reqs[a] for a in assign])
    for j, a in enumerate(assign):
        assert outs[j].outputs[0].token_ids == merged[a][j], (j, a)
    # Memory: one base, and beside it exactly the adapters' own tensors (nothing padded, no merged copies).
    from wslm.backend.modeling.weight_bytes import weight_bytes

    runner = _runner(llm)
    base = sum(weight_bytes(runner.model).values())
    assert sorted(runner.lora.list_loras()) == [1, 2, 3, 4]
    assert runner.lora.nbytes() == sum(sizes)
    assert base + runner.lora.nbytes() <= 1.1 * (base + sum(sizes))
    # One adapter for every prompt (a single request list form) equals its merged model too.
    outs = llm.generate(PROMPTS[:3], GREEDY, lora_request=reqs[2])
    assert [o.outputs[0].token_ids for o in outs] == merged[2][:3]


def test_more_adapters_than_max_loras_wait_their_turn_in_the_gpu_slot_layout(setup):
    """--max-loras 2 with 4 adapters: requests wait for a free adapter and the least recently used idle one is
    evicted; run through the slot buffers and batched kernel the CUDA path uses (here with the kernel's
    PyTorch reference on CPU; the Triton kernel matches that reference in tests/test_kernels_lora.py)."""
    from wslm.backend.lora.manager import LoraManager
    from wslm.kernels.torch_lora import lora_delta

    folder, _, paths, _, merged, _ = setup
    small = LLM(str(folder), enable_lora=True, max_loras=2, **KW)
    runner = _runner(small)
    runner.lora = LoraManager(runner.model, 2, 16, slot_kernel=lora_delta)
    reqs = _requests(paths)
    assign = [0, 1, None, 2, 3, 0, None, 1]
    outs = small.generate(PROMPTS, GREEDY, lora_request=[None if a is None else reqs[a] for a in assign])
    assert [o.outputs[0].token_ids for o in outs] == [merged[a][j] for j, a in enumerate(assign)]
    assert len(runner.lora.list_loras()) == 2


def test_prefix_cache_is_keyed_on_the_adapter(setup, llm):
    _, _, paths, _, merged, _ = setup
    a0, a1 = _requests(paths)[:2]
    prompt = " ".join(["token"] * 40)  # several full KV blocks
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    first = llm.generate([prompt], params, lora_request=a0)[0]
    other = llm.generate([prompt], params, lora_request=a1)[0]
    again = llm.generate([prompt], params, lora_request=a1)[0]
    base = llm.generate([prompt], params)[0]
    assert first.num_cached_tokens == 0 and other.num_cached_tokens == 0 and base.num_cached_tokens == 0
    assert again.num_cached_tokens > 0 and again.outputs[0].token_ids == other.outputs[0].token_ids
    assert first.outputs[0].token_ids != other.outputs[0].token_ids


def test_bad_adapters_are_refused_naming_the_cause(setup, llm, tmp_path):
    folder, _, paths, _, _, root = setup
    with pytest.raises(ValueError, match="above --max-lora-rank 16; raise --max-lora-rank"):
        llm.generate(PROMPTS[:1], GREEDY, lora_request=LoRARequest("big", 9, str(root / "big")))
    with pytest.raises(ValueError, match="no adapter_config.json"):
        llm.generate(PROMPTS[:1], GREEDY, lora_request=LoRARequest("none", 10, str(tmp_path)))
    with pytest.raises(ValueError, match="2 prompts but 1 LoRA requests"):
        llm.generate(PROMPTS[:2], GREEDY, lora_request=[_requests(paths)[0]])
    with pytest.raises(ValueError, match="lora_int_id must be a positive"):
        LoRARequest("x", 0, str(paths[0]))


@pytest.fixture(scope="module")
def server(setup):
    folder, _, paths, _, _, _ = setup
    srv = ServerProcess("--model", str(folder), "--port", "0", "--served-model-name", "base", "--dtype", "float32",
                        "--kv-cache-memory", "16MiB", "--enable-lora", "--max-loras", "2",
                        "--lora-modules", f"a0={paths[0]}",
                        json.dumps({"name": "a2", "path": str(paths[2]), "base_model_name": "base"}),
                        env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"})  # fmt: skip
    yield srv
    srv.stop()


def test_server_serves_adapters_by_name_and_loads_them_at_run_time(setup, llm, server):
    _, _, paths, _, merged, _ = setup
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    cards = {m.id: m for m in client.models.list().data}
    assert set(cards) == {"base", "a0", "a2"}
    assert cards["a0"].model_extra["parent"] == "base" and cards["a0"].model_extra["root"] == str(paths[0])
    assert cards["base"].model_extra["parent"] is None
    ids = llm.get_tokenizer().encode(PROMPTS[0])
    for model, want in (("a0", merged[0][0]), ("base", merged[None][0]), ("a2", merged[2][0])):
        r = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=10, temperature=0,
                                      extra_body={"ignore_eos": True, "return_token_ids": True})
        assert r.model == model and r.choices[0].token_ids == want, model
        assert r.usage.prompt_tokens == len(ids)

    admin = httpx.Client(base_url=server.base_url.removesuffix("/v1"), timeout=60)
    r = admin.post("/v1/load_lora_adapter", json={"lora_name": "a1", "lora_path": str(paths[1])})
    assert r.status_code == 200 and "a1" in r.text
    assert admin.post("/v1/load_lora_adapter", json={"lora_name": "a1", "lora_path": str(paths[1])}).status_code == 400
    assert admin.post("/v1/load_lora_adapter", json={"lora_name": "x"}).status_code == 400
    missing = admin.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(paths[0]) + "-gone"})
    assert missing.status_code == 404
    assert client.models.retrieve("a1").model_extra["parent"] == "base"

    messages = [{"role": "user", "content": "Say something"}]
    chat = client.chat.completions.create(model="a1", messages=messages, max_tokens=8, temperature=0)
    want = llm.chat(messages, SamplingParams(temperature=0, max_tokens=8),
                    lora_request=LoRARequest("a1", 2, str(paths[1])))[0].outputs[0].text
    assert chat.model == "a1" and chat.choices[0].message.content == want

    assert admin.post("/v1/unload_lora_adapter", json={"lora_name": "a1"}).status_code == 200
    assert admin.post("/v1/unload_lora_adapter", json={"lora_name": "a1"}).status_code == 404
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="a1", messages=messages, max_tokens=2)
    assert "a1" not in {m.id for m in client.models.list().data}


def test_adapters_over_a_quantized_gguf_base(monkeypatch, tmp_path):
    """The demo GGUF kept quantized (Q4_1 blocks): adapters add beside the quantized layers, which stay as
    they are; a request's tokens are the same alone or batched with other adapters' and the base's."""
    monkeypatch.setenv("WSLM_GGUF_DEQUANTIZE", "0")
    llm = LLM("demo", enable_lora=True, max_loras=2, kv_cache_memory=32 << 20)
    model = _runner(llm).model
    assert model.cfg.quantization  # the base is held quantized
    cfg = model.cfg
    config = {"hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size, "head_dim": cfg.head_dim,
              "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
              "num_hidden_layers": cfg.num_layers}
    reqs = []
    for i in range(2):
        write_adapter(tmp_path / f"g{i}", config, 8, seed=i, targets=("q_proj", "v_proj", "down_proj"), std=0.1)
        reqs.append(LoRARequest(f"g{i}", i + 1, str(tmp_path / f"g{i}")))
    # The first token's logprobs (the prompt's forward). The GGUF kernels quantize the activations to 8 bits
    # (llama.cpp's Q8 blocks), so the float rounding of the delta (~1e-7: another set of resident adapters is
    # another matmul shape) can flip an activation code: measured up to 0.17 apart in logprob here, the same
    # top token. The dense base is exact (the tests above).
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=3)
    prompts = ["The capital of France is", "Write a haiku about", "1, 2, 3,"]
    assign = [reqs[0], None, reqs[1]]

    def top(out):
        return {k: v.logprob for k, v in out.outputs[0].logprobs[0].items()}

    alone = [top(llm.generate([p], params, lora_request=r)[0]) for p, r in zip(prompts, assign)]
    mixed = [top(o) for o in llm.generate(prompts, params, lora_request=assign)]
    for a, m in zip(alone, mixed):
        best = max(a, key=a.get)
        assert best == max(m, key=m.get) and abs(a[best] - m[best]) < 0.25, (a, m)
    base = top(llm.generate(prompts[:1], params)[0])
    assert base != pytest.approx(alone[0], abs=1e-2)  # the adapter changes the distribution


def test_an_adapter_for_another_model_is_a_400_not_a_failed_step(setup, llm, server, tmp_path):
    folder, config, paths, *_ = setup
    other = write_adapter(tmp_path / "wide", {**config, "hidden_size": 96, "num_attention_heads": 6}, 4, seed=5)
    assert other
    with pytest.raises(ValueError, match="an adapter for another model"):
        llm.generate(PROMPTS[:1], GREEDY, lora_request=LoRARequest("wide", 77, str(tmp_path / "wide")))
    admin = httpx.Client(base_url=server.base_url.removesuffix("/v1"), timeout=60)
    r = admin.post("/v1/load_lora_adapter", json={"lora_name": "wide", "lora_path": str(tmp_path / "wide")})
    assert r.status_code == 400 and "another model" in r.text
    assert llm.generate(PROMPTS[:1], GREEDY)[0].outputs[0].token_ids  # the engine goes on
