"""GGUF repos: one quantization picked out of many, its metadata read from the header, ids and removal."""

from __future__ import annotations

from pathlib import Path

import pytest
from hub_server import FakeHub, make_tiny_gguf
from test_models_pull import env, warm_metadata, wslm, wslm_text  # noqa: F401 - shared fixture and runners

from wslm.backend.hub.quant import gguf_variants, pick_variant, quant_label

QUANTS = ["Q2_K", "Q8_0", "Q4_K_M", "F16", "Q4_K_S"]


def test_quant_labels_and_preference():
    assert quant_label("Llama-3.2-1B-Instruct-Q4_K_M.gguf") == "Q4_K_M"
    assert quant_label("qwen2.5-0.5b-instruct-q8_0.gguf") == "Q8_0"
    assert quant_label("model.IQ4_XS.gguf") == "IQ4_XS"
    assert quant_label("model-fp16.gguf") == "F16"
    assert quant_label("Q5_K_M/model-Q5_K_M-00001-of-00002.gguf") == "Q5_K_M"
    assert quant_label("model.gguf") is None
    files = {f"m-{q}.gguf": 100 for q in QUANTS} | {"mmproj-m-f16.gguf": 10, "README.md": 1}
    assert pick_variant(gguf_variants(files)).label == "Q4_K_M"
    del files["m-Q4_K_M.gguf"]
    assert pick_variant(gguf_variants(files)).label == "Q4_K_S"
    assert pick_variant(gguf_variants({"m-Q2_K.gguf": 1, "m-Q8_0.gguf": 2, "m-F16.gguf": 3})).label == "Q8_0"
    split = {"big-Q4_K_M-00001-of-00002.gguf": 5, "big-Q4_K_M-00002-of-00002.gguf": 5, "big-Q8_0.gguf": 20}
    v = pick_variant(gguf_variants(split))
    assert v.files == ["big-Q4_K_M-00001-of-00002.gguf", "big-Q4_K_M-00002-of-00002.gguf"] and v.size == 10
    assert pick_variant(gguf_variants(split), "q8_0").name == "big-Q8_0.gguf"
    assert gguf_variants({"mmproj-f16.gguf": 1}) == []


@pytest.fixture
def gguf_hub(tmp_path):
    repo = tmp_path / "repo"
    for q in QUANTS:
        make_tiny_gguf(repo / f"tiny-{q}.gguf", file_type=q)
    make_tiny_gguf(repo / "mmproj-tiny-F16.gguf", file_type="F16", arch="clip")
    (repo / "README.md").write_text("# tiny\n")
    with FakeHub() as hub:
        hub.add_repo("org/tiny-GGUF", repo)
        yield hub


def test_pull_picks_one_quant_and_lists_it(gguf_hub, env):  # noqa: F811
    hub = gguf_hub
    rc, events, err = wslm("models", "pull", "org/tiny-GGUF", "--endpoint", hub.url, "--json", env=env)
    assert rc == 0, err
    start, done = events[0], events[-1]
    assert [f["name"] for f in start["files"]] == ["tiny-Q4_K_M.gguf"]
    assert start["selected"]["quantization"] == "Q4_K_M" and "Q8_0" in start["selected"]["alternatives"]
    assert "Q4_K_M" in start["note"] and "--file" in start["note"]
    assert done["id"] == "org/tiny-GGUF/tiny-Q4_K_M.gguf" and done["path"].endswith("tiny-Q4_K_M.gguf")
    assert not hub.file_requests("tiny-Q8_0.gguf") and not hub.file_requests("mmproj-tiny-F16.gguf")

    # People see which one was picked, too.
    rc, out, _ = wslm_text("models", "pull", "org/tiny-GGUF", "--endpoint", hub.url, env=env)
    assert (
        rc == 0
        and "Picked Q4_K_M (tiny-Q4_K_M.gguf)" in out
        and "Done: org/tiny-GGUF/tiny-Q4_K_M.gguf" in out
    )

    rc, listed, _ = wslm("models", "list", "--json", env=env)
    entry = next(m for m in listed[0]["models"] if m["id"] == done["id"])
    assert entry["format"] == "gguf" and entry["source"] == "hf-cache" and entry["supported"] is True
    assert entry["architecture"] == "LlamaForCausalLM" and entry["quantization"] == "Q4_K_M"
    assert entry["context_length"] == 512 and entry["num_params"] == 3 * 64 + 64 * 64

    from wslm.backend.hub import resolve_model

    assert resolve_model("org/tiny-GGUF") == Path(done["path"])  # the repo id loads the picked file
    assert resolve_model("org/tiny-GGUF:Q4_K_M") == Path(done["path"])


def test_choose_by_tag_or_pattern_and_remove_one(gguf_hub, env):  # noqa: F811
    hub = gguf_hub
    rc, events, err = wslm("models", "pull", "org/tiny-GGUF:Q8_0", "--endpoint", hub.url, "--json", env=env)
    assert rc == 0, err and events[-1]["id"].endswith("tiny-Q8_0.gguf")
    rc, events, err = wslm(
        "models", "pull", "org/tiny-GGUF", "--file", "*Q2_K*", "--endpoint", hub.url, "--json", env=env
    )
    assert rc == 0, err and [f["name"] for f in events[0]["files"]] == ["tiny-Q2_K.gguf"]
    rc, events, _ = wslm("models", "pull", "org/tiny-GGUF:Q3_K_L", "--endpoint", hub.url, "--json", env=env)
    assert rc == 1 and events[-1]["code"] == "not_found" and "Q8_0" in events[-1]["message"]

    rc, listed, _ = wslm("models", "list", "--json", env=env)
    ids = {m["id"] for m in listed[0]["models"]}
    assert {"org/tiny-GGUF/tiny-Q8_0.gguf", "org/tiny-GGUF/tiny-Q2_K.gguf"} <= ids

    rc, out, _ = wslm("models", "rm", "org/tiny-GGUF/tiny-Q2_K.gguf", "--yes", "--json", env=env)
    assert rc == 0 and out[0]["freed_bytes"] > 0
    rc, listed, _ = wslm("models", "list", "--json", env=env)
    ids = {m["id"] for m in listed[0]["models"]}
    assert "org/tiny-GGUF/tiny-Q2_K.gguf" not in ids and "org/tiny-GGUF/tiny-Q8_0.gguf" in ids
    rc, out, _ = wslm("models", "rm", "org/tiny-GGUF:Q8_0", "--yes", "--json", env=env)
    assert rc == 0
    assert not (Path(env["HF_HUB_CACHE"]) / "models--org--tiny-GGUF").exists()  # the last one takes the repo
