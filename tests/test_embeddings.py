"""/v1/embeddings on real servers, through the official openai client: a tiny random BERT saved as a
sentence-transformers model (mean pooling + Normalize) must give sentence-transformers' own vectors, and a
tiny random Qwen3 embedding model (last-token pooling) HF's pooled output; inputs as text and as token ids,
base64, `dimensions` (Matryoshka) and its 400. An XLM-RoBERTa with CLS pooling runs in-process (LLM.embed)."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import openai
import pytest
import torch
from test_server_helpers import ServerProcess

WORDS = ("the cat sat on a mat dog ran in park sun is hot cold water blue sky red apple tree green grass "
         "query passage what where why how lighthouse sea").split()
TEXTS = ["the cat sat on a mat", "a dog ran in the park", "what is the sky", "red apple tree"]


def make_bert_tokenizer(folder, words=WORDS):
    from transformers import BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *letters, *("##" + c for c in letters)]
    (folder / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    return BertTokenizerFast(str(folder / "vocab.txt"))


def make_encoder(folder, kind: str, pooling: str, seed: int, words=WORDS):
    """A 2-layer random encoder saved as a sentence-transformers model (modules.json, 1_Pooling, 2_Normalize);
    `words`: its vocabulary (whole words; anything else is spelt out in letters)."""
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel, XLMRobertaConfig, XLMRobertaModel

    torch.manual_seed(seed)
    tok = make_bert_tokenizer(folder / "hf", words)
    common = dict(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=128, max_position_embeddings=130, initializer_range=0.2)
    if kind == "bert":
        model = BertModel(BertConfig(**common))
    else:  # positions counted from pad_token_id + 1; one token type
        model = XLMRobertaModel(XLMRobertaConfig(pad_token_id=0, type_vocab_size=1, **common))
    model.save_pretrained(folder / "hf")
    tok.save_pretrained(folder / "hf")
    word = models.Transformer(str(folder / "hf"), max_seq_length=128)
    st = SentenceTransformer(modules=[word, models.Pooling(64, pooling_mode=pooling), models.Normalize()],
                             device="cpu")
    st.save(str(folder / "st"))
    return folder / "st", st


def make_qwen3_embedding(folder, seed: int = 3):
    """A tiny random Qwen3 body (no LM head, as embedding checkpoints ship) with the demo tokenizer; its
    config says Matryoshka dimensions are allowed."""
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(seed)
    tok = make_bert_tokenizer(folder)  # any tokenizer does: the server and the reference share it
    common = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2,
                  tie_word_embeddings=True, eos_token_id=tok.sep_token_id)
    model = Qwen3Model(Qwen3Config(head_dim=16, **common)).eval()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["is_matryoshka"] = True
    (folder / "config.json").write_text(json.dumps(cfg))
    from transformers import AutoTokenizer

    return folder, model, AutoTokenizer.from_pretrained(str(folder))  # the tokenizer as the server reads it


def cosine(a, b) -> float:
    a, b = (np.frombuffer(base64.b64decode(x), dtype="<f4") if isinstance(x, str) else x for x in (a, b))
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    folder, st = make_encoder(tmp_path_factory.mktemp("bert"), "bert", "mean", seed=1)
    srv = ServerProcess(str(folder), "--port", "0", "--uvicorn-log-level", "warning", "--shutdown-timeout", "0", "--served-model-name", "bert")
    yield srv, st
    srv.stop()


def test_bert_matches_sentence_transformers(bert):
    srv, st = bert
    client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
    expected = st.encode(TEXTS, convert_to_numpy=True)
    got = client.embeddings.create(model="bert", input=TEXTS)
    assert [d.index for d in got.data] == [0, 1, 2, 3] and len(got.data[0].embedding) == 64
    for e, d in zip(expected, got.data):
        assert cosine(e, d.embedding) > 0.9999
        assert abs(np.linalg.norm(d.embedding) - 1.0) < 1e-5
    ids = [st.tokenizer(t)["input_ids"] for t in TEXTS]
    assert got.usage.prompt_tokens == sum(len(i) for i in ids)
    # Token ids (LangChain's form), one list and a list of lists; base64 asked for explicitly (the client
    # asks for it by itself otherwise, and decodes it: the calls above).
    one = client.embeddings.create(model="bert", input=ids[0])
    assert cosine(expected[0], one.data[0].embedding) > 0.9999
    many = client.embeddings.create(model="bert", input=ids, encoding_format="base64")
    for e, d in zip(expected, many.data):
        assert cosine(e, d.embedding) > 0.9999
    # What the model can do, and what it cannot.
    card = httpx.get(srv.base_url + "/models").json()["data"][0]
    assert card["task"] == "embed" and card["capabilities"] == ["embeddings"] and srv.ready["task"] == "embed"
    with pytest.raises(openai.BadRequestError, match="Matryoshka"):
        client.embeddings.create(model="bert", input="the cat", dimensions=16)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.embeddings.create(model="bert", input="cat " * 200)
    # vLLM's truncate_prompt_tokens: long inputs cut to fit instead (-1: the model's whole context).
    cut = client.embeddings.create(model="bert", input="cat " * 200, extra_body={"truncate_prompt_tokens": -1})
    # sentence_bert_config.json's max_seq_length (128) caps the 130 positions, as sentence-transformers cuts.
    assert cut.usage.prompt_tokens == srv.ready["max_model_len"] == 128
    short = client.embeddings.create(model="bert", input=TEXTS[0], extra_body={"truncate_prompt_tokens": 4})
    assert short.usage.prompt_tokens == 4
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="bert", messages=[{"role": "user", "content": "hi"}])


def test_xlm_roberta_cls_pooling_in_process(tmp_path):
    from wslm.backend import LLM

    folder, st = make_encoder(tmp_path, "xlmr", "cls", seed=2)
    llm = LLM(str(folder), task="auto")
    got = llm.embed(TEXTS)
    expected = st.encode(TEXTS, convert_to_numpy=True)
    for e, out in zip(expected, got):
        assert cosine(e, out.outputs.embedding) > 0.9999


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    folder, model, tok = make_qwen3_embedding(tmp_path_factory.mktemp("qwen3emb"))
    srv = ServerProcess(str(folder), "--port", "0", "--uvicorn-log-level", "warning", "--shutdown-timeout", "0", "--served-model-name", "q3",
                        "--kv-cache-memory", "32MiB", "--dtype", "float32")
    yield srv, model, tok, folder
    srv.stop()


def _hf_last_token(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        hidden = model(torch.tensor([ids])).last_hidden_state[0, -1]
    return torch.nn.functional.normalize(hidden, dim=-1)


def test_qwen3_last_token_matches_hf(qwen3):
    srv, model, tok, _ = qwen3
    client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
    instruct = "Instruct: Given a web search query, retrieve relevant passages\nQuery: "  # the client's job
    texts = [instruct + "where is the lighthouse", "the lighthouse stands on the rocks by the sea"]
    got = client.embeddings.create(model="q3", input=texts)
    ids = [tok.encode(t) for t in texts]
    for i, d in zip(ids, got.data):
        assert cosine(_hf_last_token(model, i), d.embedding) > 0.9999
    by_ids = client.embeddings.create(model="q3", input=ids, encoding_format="base64")
    for i, d in zip(ids, by_ids.data):
        assert cosine(_hf_last_token(model, i), d.embedding) > 0.9999
    # Matryoshka: the first 16 values, unit length again.
    cut = client.embeddings.create(model="q3", input=texts[1], dimensions=16).data[0].embedding
    full = _hf_last_token(model, ids[1])
    assert len(cut) == 16 and cosine(torch.nn.functional.normalize(full[:16], dim=0), cut) > 0.9999
    assert abs(np.linalg.norm(cut) - 1.0) < 1e-5
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model="q3", input="x", dimensions=65)
    # Batched with each other: the same vectors as alone.
    alone = client.embeddings.create(model="q3", input=texts[0]).data[0].embedding
    assert cosine(alone, got.data[0].embedding) > 0.99999
    assert httpx.get(srv.base_url + "/models").json()["data"][0]["task"] == "embed"


def test_cross_encoder_rerank_and_score(tmp_path):
    """A tiny random BertForSequenceClassification (one label, as rerankers) answers /rerank and /score
    with sigmoid(logit), as sentence-transformers' CrossEncoder; the order follows the scores."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(4)
    tok = make_bert_tokenizer(tmp_path)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=130, initializer_range=0.2, num_labels=1)).eval()
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    query, docs = "where is the cat", ["the cat sat on a mat", "blue sky", "a dog ran in the park"]
    with torch.no_grad():
        expected = torch.sigmoid(model(**tok([query] * 3, docs, padding=True, return_tensors="pt")).logits[:, 0])
    from wslm.backend import LLM

    offline = [o.outputs.data[0].item() for o in LLM(str(tmp_path)).score(query, docs)]
    assert offline == pytest.approx(expected.tolist(), abs=1e-5)
    srv = ServerProcess(str(tmp_path), "--port", "0", "--uvicorn-log-level", "warning", "--shutdown-timeout", "0", "--served-model-name", "rr")
    try:
        r = httpx.post(srv.url + "/rerank", json={"model": "rr", "query": query, "documents": docs, "top_n": 2})
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        best = sorted(range(3), key=lambda i: -float(expected[i]))[:2]
        assert [x["index"] for x in results] == best
        for x in results:
            assert abs(x["relevance_score"] - float(expected[x["index"]])) < 1e-5
            assert x["document"]["text"] == docs[x["index"]]
        s = httpx.post(srv.url + "/v1/score", json={"model": "rr", "text_1": query, "text_2": docs}).json()
        assert [round(d["score"], 5) for d in s["data"]] == [round(float(e), 5) for e in expected]
        card = httpx.get(srv.base_url + "/models").json()["data"][0]
        assert card["task"] == "score" and card["capabilities"] == ["score", "rerank"]
        no = httpx.post(srv.base_url + "/embeddings", json={"model": "rr", "input": "cat"})
        assert no.status_code == 400 and no.json()["error"]["code"] == "model_not_supported"
    finally:
        srv.stop()


def test_decoder_embedding_is_prefill_only_and_chunked(qwen3):
    """Offline, with an 8-token budget: a 30-token prompt is prefilled in 4 chunks batched with a short one,
    both vectors equal HF's, nothing is generated and every KV block is free again afterwards."""
    from wslm.backend import LLM

    _, model, tok, folder = qwen3
    llm = LLM(str(folder), dtype="float32", kv_cache_memory=8 << 20, max_num_batched_tokens=8)
    texts = ["instruct what is the sky query where is the lighthouse by the sea", "red apple"]
    outs = llm.embed(texts)
    for t, out in zip(texts, outs):
        assert cosine(_hf_last_token(model, tok.encode(t)), out.outputs.embedding) > 0.9999
    stats = llm.llm_engine.get_stats()
    assert stats["num_free_blocks"] == stats["num_blocks"] and stats["generation_tokens_total"] == 0
    assert len(tok.encode(texts[0])) > 16  # really chunked (and more than one block)


def test_decoder_embedding_honours_max_seq_length(qwen3, tmp_path):
    """sentence_bert_config.json's max_seq_length caps a decoder embedding model's context, as it does an
    encoder's (and vLLM's): 40 of the body's 512 positions."""
    import shutil

    from wslm.backend import LLM

    folder = tmp_path / "q3"
    shutil.copytree(qwen3[3], folder)
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 40}))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_lasttoken": True}))
    llm = LLM(str(folder), dtype="float32", kv_cache_memory=8 << 20)
    assert llm.llm_engine.max_model_len == 40
