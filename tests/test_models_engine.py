"""The end of the line: a model pulled from the (loopback) hub generates with wslm's own engine, loaded by its
repo id from the HF cache, offline."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from hub_server import FakeHub
from test_models_pull import env, tiny_llama, warm_metadata  # noqa: F401 - shared fixtures

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("wslm.backend.entrypoints.llm") is None,
    reason="wslm.backend.entrypoints.llm (the engine) has not landed yet",
)


def test_pulled_model_generates_by_repo_id_and_by_path(env, tiny_llama, monkeypatch):  # noqa: F811
    from wslm.backend import LLM, SamplingParams
    from wslm.backend.hub.download import Puller

    with FakeHub() as hub:
        hub.add_repo("org/tiny", tiny_llama)
        done = Puller("org/tiny", endpoint=hub.url).run()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub is gone: everything must come from the cache
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)  # a random tiny model may say EOS
    for model in ("org/tiny", done["path"]):
        llm = LLM(model=model, device="cpu", kv_cache_memory=16 * 2**20)
        out = llm.generate(["hi"], params)
        assert len(out) == 1 and len(out[0].outputs[0].token_ids) == 4, model
    assert Path(done["path"]).is_dir()
