"""Several models behind one port (issue 26): `wslm serve --model-pool ...` loads a model when a request names
it, unloads it after --model-ttl idle or a request's keep_alive, and evicts the least recently used idle
model past --max-loaded-models. One real server (the demo plus the demo GGUF linked into a models folder
under another name) for the HTTP contract; the pool's bookkeeping (eviction, busy models, failures) on fake
models, where each case takes milliseconds instead of a load."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import openai
import pytest
from test_server_helpers import SMALL, ServerProcess, metric

from wslm.backend.entrypoints.openai.errors import APIError
from wslm.backend.entrypoints.openai.model_pool import (
    ModelPool,
    PoolBusy,
    merge_metrics,
    parse_keep_alive,
    parse_pool_spec,
)

TTL = 2.0  # the server's --model-ttl: short, so that the idle unload shows within the test


CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def make_tiny_chat_model(folder: Path) -> Path:
    """A 2-layer Llama with random weights and a byte-level tokenizer with a chat template, written without
    transformers (quick): loads in a second (the demo takes ten on 2 busy cores) and answers differently."""
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    folder.mkdir(parents=True)
    specials = ["<s>", "</s>", "<unk>"]
    vocab = {t: i for i, t in enumerate(specials + sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab, [], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "chat_template": CHAT_TEMPLATE}))
    hidden, inter, layers, heads, kv_heads = 64, 128, 2, 4, 2
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": len(vocab),
        "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "bos_token_id": 0, "eos_token_id": 1,
        "tie_word_embeddings": False, "torch_dtype": "float32"}))
    gen = torch.Generator().manual_seed(0)
    kv = hidden // heads * kv_heads
    shapes = {"model.embed_tokens.weight": (len(vocab), hidden), "lm_head.weight": (len(vocab), hidden),
              "model.norm.weight": (hidden,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (hidden, hidden), p + "self_attn.k_proj.weight": (kv, hidden),
                       p + "self_attn.v_proj.weight": (kv, hidden), p + "self_attn.o_proj.weight": (hidden, hidden),
                       p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
                       p + "mlp.down_proj.weight": (hidden, inter), p + "input_layernorm.weight": (hidden,),
                       p + "post_attention_layernorm.weight": (hidden,)})
    save_file({k: torch.ones(v) if len(v) == 1 else torch.randn(v, generator=gen) * 0.2 for k, v in shapes.items()},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    make_tiny_chat_model(models / "second")  # `wslm models list` shows it as "second"
    srv = ServerProcess("--port", "0", *SMALL, "--enforce-eager", "--model-pool", "second",
                        "--model-ttl", str(TTL), env={"WSLM_MODELS_DIR": str(models)})
    yield srv
    srv.stop()


def _states(srv: ServerProcess) -> dict[str, str]:
    data = httpx.get(srv.base_url + "/models", timeout=30).json()["data"]
    return {m["id"]: m["state"] for m in data}


def _wait_state(srv: ServerProcess, name: str, state: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while (got := _states(srv)[name]) != state:
        assert time.monotonic() < deadline, f"{name} stayed {got}, expected {state}"
        time.sleep(0.1)


def _chat(client: openai.OpenAI, model: str, **extra):
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                          temperature=0, extra_body=extra or None)


def test_models_lists_every_servable_model_with_its_state(server):
    data = httpx.get(server.base_url + "/models", timeout=30).json()["data"]
    assert [(m["id"], m["state"]) for m in data] == [("demo", "loaded"), ("second", "not-loaded")]
    assert data[0]["max_model_len"] == 1024 and data[1]["object"] == "model"
    card = httpx.get(server.base_url + "/models/second", timeout=30).json()
    assert card["id"] == "second" and card["state"] == "not-loaded"


def test_unknown_model_is_404_naming_the_servable_ones(server):
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError) as info:
        _chat(client, "nope")
    assert info.value.body["code"] == "model_not_found"
    assert "`demo`, `second`" in info.value.body["message"]


def test_concurrent_first_requests_share_one_load_and_the_default_is_unaffected(server):
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=300)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        seconds = [pool.submit(_chat, client, "second") for _ in range(3)]
        deadline = time.monotonic() + 60
        while _states(server)["second"] != "loading":  # the default model answers while the other loads
            assert time.monotonic() < deadline and not any(f.done() for f in seconds)
            time.sleep(0.05)
        assert _chat(client, "demo").model == "demo"
        replies = [f.result() for f in seconds]
    answered = time.monotonic()
    # Read the pool before anything else: --model-ttl is short, and a loaded machine can outlast it.
    state = _states(server)["second"]
    text = httpx.get(server.url + "/metrics", timeout=30).text
    late = time.monotonic() - answered >= TTL - 0.5
    assert state == "loaded" or late, state
    if state == "loaded" and not late:
        assert metric(text, "wslm:model_loaded", 'model_name="second"') == 1
        assert metric(text, "wslm:generation_tokens_total", 'model_name="second"') >= 3  # each model its own
    assert all(r.model == "second" and r.usage.completion_tokens == 3 for r in replies)
    # Each from its own model: the tiny random model does not reply as the demo does.
    assert replies[0].choices[0].message.content != _chat(client, "demo").choices[0].message.content
    assert server.stderr().count("Loading model 'second'") == 1
    assert _chat(client, "demo").choices[0].message.content


def test_idle_model_unloads_after_the_ttl(server):
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=300)
    assert _chat(client, "second").model == "second"  # loads it if the previous test's copy already went
    answered = time.monotonic()
    _wait_state(server, "second", "not-loaded", timeout=TTL + 15)
    assert time.monotonic() - answered >= TTL - 0.5  # not before its --model-ttl
    assert f"Unloading model 'second' (idle for {TTL:g} s)" in server.stderr()


def test_load_endpoint_then_keep_alive_zero_unloads_after_the_request(server):
    card = httpx.post(server.base_url + "/models/load", json={"model": "second", "keep_alive": "10m"},
                      timeout=300).json()
    assert card["state"] == "loaded" and card["expires_in"] > 500
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=300)
    stream = client.chat.completions.create(model="second", messages=[{"role": "user", "content": "Hi"}],
                                            max_tokens=3, stream=True, extra_body={"keep_alive": 0})
    assert {c.model for c in stream} == {"second"}
    _wait_state(server, "second", "not-loaded", timeout=5)
    assert "Unloading model 'second' (keep_alive 0)" in server.stderr()
    bad = httpx.post(server.base_url + "/chat/completions", timeout=30,
                     json={"model": "second", "keep_alive": "soon", "messages": [{"role": "user", "content": "x"}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "keep_alive"
    assert httpx.post(server.base_url + "/models/unload", json={"model": "demo"}, timeout=30).status_code == 400
    assert _states(server) == {"demo": "loaded", "second": "not-loaded"}


# ---- the pool's bookkeeping on fake models -----------------------------------------------------------------
class FakeEngine:
    def __init__(self) -> None:
        self.alive = False
        self.dead = None
        self.draining = False
        self.on_death = None

    def start(self, loop) -> None:
        self.alive = True

    def stop(self) -> None:
        self.alive = False

    def begin_drain(self, grace: float) -> None:
        self.draining = True


def _state(name: str):
    return SimpleNamespace(engine=FakeEngine(), served_model_names=[name], aliases=set(), metrics=None)


class FakeLoader:
    def __init__(self, delay: float = 0.0, fail: dict[str, BaseException] | None = None) -> None:
        self.delay = delay
        self.fail = fail or {}
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, model: str, name: str):
        with self.lock:
            self.calls.append(name)
        time.sleep(self.delay)
        if name in self.fail:
            raise self.fail[name]
        return _state(name)


def _pool(loader, names=("a", "b", "c"), **kwargs) -> ModelPool:
    pool = ModelPool(_state("default"), loader, [(n, n) for n in names], **kwargs)
    pool.start()
    return pool


async def _until(condition, timeout: float = 10.0) -> None:
    """Polls condition until it holds: what runs in worker threads finishes when the machine lets it."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_keep_alive_and_pool_spec_parsing():
    assert parse_keep_alive(0) == 0 and parse_keep_alive("300") == 300 and parse_keep_alive(2.5) == 2.5
    assert parse_keep_alive("5m") == 300 and parse_keep_alive("1h30m") == 5400 and parse_keep_alive("250ms") == 0.25
    assert parse_keep_alive(-1) is None and parse_keep_alive("-1m") is None  # negative: keep loaded
    for bad in ("soon", "", "5 minutes", True, None, "nan", [1]):
        with pytest.raises(ValueError, match="keep_alive"):
            parse_keep_alive(bad)
    assert parse_pool_spec("second") == ("second", "second")
    assert parse_pool_spec("small=org/repo") == ("small", "org/repo")
    assert parse_pool_spec("/models/x.gguf") == ("/models/x.gguf", "/models/x.gguf")


def test_concurrent_acquires_share_one_load():
    async def main():
        loader = FakeLoader(delay=0.2)
        pool = _pool(loader)
        states = await asyncio.gather(*(pool.acquire(pool.entries["a"]) for _ in range(5)))
        assert loader.calls == ["a"] and all(s is states[0] for s in states)
        assert pool.entries["a"].in_flight == 5
        pool.stop()

    _run(main())


def test_least_recently_used_idle_model_is_evicted_never_a_busy_one():
    async def main():
        pool = _pool(FakeLoader(), max_loaded=3, ttl=None)  # the default + 2
        a, b, c = (pool.entries[n] for n in "abc")
        for entry in (a, b, a):  # b is now the least recently used
            await pool.acquire(entry)
            pool.release(entry)
            await asyncio.sleep(0.01)
        b_state = b.state
        await pool.acquire(c)
        pool.release(c)
        assert (a.status, b.status, c.status) == ("loaded", "not-loaded", "loaded")
        assert not b_state.engine.alive  # stopped before c loaded
        await pool.acquire(a)
        await pool.acquire(c)  # both busy: no room for b
        with pytest.raises(PoolBusy) as info:
            await pool.acquire(b)
        assert info.value.status_code == 503 and info.value.retry_after > 0
        assert "--max-loaded-models" in info.value.message
        pool.release(c)
        await pool.acquire(b)  # c is idle now: it goes
        assert (a.status, b.status, c.status) == ("loaded", "loaded", "not-loaded")
        pool.stop()

    _run(main())


def test_the_shipped_embedding_model_is_not_counted():
    """It embeds a chat's documents beside whichever chat model is loaded: loading it never unloads that
    one, and it takes no slot of --max-loaded-models."""
    async def main():
        pool = _pool(FakeLoader(), names=("a", "b", "all-minilm-l6-v2"), max_loaded=2, ttl=None)
        a, b, emb = (pool.entries[n] for n in ("a", "b", "all-minilm-l6-v2"))
        for entry in (a, emb, a, emb):
            await pool.acquire(entry)
            pool.release(entry)
        assert (a.status, emb.status) == ("loaded", "loaded") and pool.loaded_count() == 2
        await pool.acquire(b)  # a counted model still takes a's slot
        pool.release(b)
        assert (a.status, b.status, emb.status) == ("not-loaded", "loaded", "loaded")
        pool.stop()

    _run(main())


def test_ttl_and_keep_alive_unload_idle_models():
    async def main():
        pool = _pool(FakeLoader(), ttl=0.1, max_loaded=4)
        a, b, c = (pool.entries[n] for n in "abc")
        for entry, keep in ((a, pool_default := object()), (b, None), (c, 0)):
            await pool.acquire(entry)
            if keep is pool_default:
                pool.release(entry)  # --model-ttl
            else:
                pool.release(entry, keep)
        await _until(lambda: c.status == "not-loaded")  # keep_alive 0: at once (the stop runs in a thread)
        await _until(lambda: a.status == "not-loaded")  # ttl passed (a loaded CI machine may take a while)
        assert b.status == "loaded"  # keep_alive -1 keeps b
        await pool.acquire(b)
        await asyncio.sleep(0.3)
        assert b.status == "loaded"  # never while in flight
        pool.stop()

    _run(main())


def test_failed_load_names_the_model_and_the_cause_and_is_retried():
    async def main():
        oom = RuntimeError("loading failed")
        oom.__cause__ = MemoryError()
        loader = FakeLoader(fail={"a": ValueError("not a GGUF file"), "b": oom})
        pool = _pool(loader)
        with pytest.raises(APIError) as info:
            await pool.acquire(pool.entries["a"])
        assert info.value.status_code == 500 and info.value.code == "model_load_failed"
        assert "`a`" in info.value.message and "not a GGUF file" in info.value.message
        assert pool.card(pool.entries["a"])["load_error"] == "not a GGUF file"
        with pytest.raises(APIError) as info:
            await pool.acquire(pool.entries["b"])
        assert info.value.status_code == 503 and info.value.code == "out_of_memory"
        loader.fail.clear()
        assert (await pool.acquire(pool.entries["a"])).engine.alive  # tried again
        assert pool.entries["a"].error is None and pool.default.engine is not None
        pool.stop()

    _run(main())


def test_merged_metrics_name_each_family_once():
    one = "# HELP x X.\n# TYPE x gauge\nx{model_name=\"a\"} 1\n# HELP y Y.\n# TYPE y counter\ny{model_name=\"a\"} 2\n"
    two = one.replace('"a"', '"b"')
    merged = merge_metrics([one, two]).splitlines()
    assert merged == ["# HELP x X.", "# TYPE x gauge", 'x{model_name="a"} 1', 'x{model_name="b"} 1',
                      "# HELP y Y.", "# TYPE y counter", 'y{model_name="a"} 2', 'y{model_name="b"} 2']


def test_startup_checks_of_the_pool_flags(tmp_path):
    from argparse import Namespace

    from wslm.backend.entrypoints.openai.launcher import StartupError, check_model_pool_flags

    def check(**kw):
        args = Namespace(**{"model_pool": None, "max_loaded_models": 2, "model_ttl": "300",
                            "model_load_timeout": 600.0, **kw})
        check_model_pool_flags(args)
        return args

    assert check().model_pool_specs == [] and check().model_ttl_seconds == 300
    assert check(model_ttl="-1").model_ttl_seconds is None
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    assert check(model_pool=[f"small={model}"]).model_pool_specs == [("small", str(model))]
    for kw, match in (({"model_pool": ["nope-not-a-model"]}, "--model-pool nope-not-a-model"),
                      ({"model_pool": [str(model)], "max_loaded_models": 1}, "at least 2"),
                      ({"model_pool": [f"x={model}", f"x={model}"]}, "twice"),
                      ({"model_ttl": "later"}, "--model-ttl")):
        with pytest.raises(StartupError, match=match):
            check(**kw)


def test_pool_all_lists_every_local_model_but_the_default_and_rescans(tmp_path, monkeypatch):
    from wslm.backend.entrypoints.openai.launcher import local_models

    monkeypatch.setenv("WSLM_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    make_tiny_chat_model(tmp_path / "models" / "mine")
    # The demo is the --model one; the shipped embedding model is listed too where it is installed.
    assert [m for m in local_models("demo") if m[0] != "all-minilm-l6-v2"] == [("mine", "mine")]

    async def main():
        found = [("a", "a")]
        pool = _pool(FakeLoader(), names=(), refresh=lambda: list(found))
        assert await pool.find("a") is not None and await pool.find("b") is None
        found[:] = [("b", "b")]
        pool._refreshed = -10.0  # rescans are at most every 2 s
        assert (await pool.find("b")).name == "b" and pool.entry("a") is None  # gone from disk, not loaded
        pool.stop()

    _run(main())
