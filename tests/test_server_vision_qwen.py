"""Qwen2.5-VL through a real `wslm serve` (a tiny random checkpoint written by the test, whose processor loads
without torchvision): a PNG as a data: URL through the official `openai` client, plain and streamed, and as
bytes through the `ollama` client gets HF transformers' greedy `generate` reply, and `/tokenize` counts the
image's tokens as the engine runs them."""

from __future__ import annotations

import httpx
import ollama
import openai
import pytest
from qwen_vl_helpers import hf_generate_top, make_tiny_qwen25vl, qwen_vl_tokenizer
from test_server_helpers import SMALL, ServerProcess
from vision_helpers import data_url, image_bytes, noise_image

QUESTION = "What is it?"
TOKENS = 6
IMG = noise_image(40, 50, 0)
PNG = image_bytes(IMG)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_qwen25vl(tmp_path_factory.mktemp("qwen25vl"))


@pytest.fixture(scope="module")
def server(folder):
    srv = ServerProcess(str(folder), "--port", "0", *SMALL, "--max-model-len", "512", "--dtype", "float32",
                        "--served-model-name", "tiny-qwen-vl")
    yield srv
    srv.stop()


def test_png_through_openai_and_ollama(server, folder):
    content = [{"type": "image_url", "image_url": {"url": data_url(PNG)}}, {"type": "text", "text": QUESTION}]
    ids, top = hf_generate_top(folder, [{"role": "user", "content": [{"type": "image"},
                                                                      {"type": "text", "text": QUESTION}]}],
                               [IMG], TOKENS, k=1)
    expected = qwen_vl_tokenizer().decode([next(iter(step)) for step in top], skip_special_tokens=True)
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": content}]
    kw = dict(model="tiny-qwen-vl", messages=messages, max_tokens=TOKENS, temperature=0,
              extra_body={"ignore_eos": True})
    reply = client.chat.completions.create(**kw)
    assert reply.choices[0].message.content == expected
    assert reply.usage.prompt_tokens == len(ids)  # the image's 30 tokens (a 6 x 5 grid) are counted
    stream = client.chat.completions.create(**kw, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected
    counted = httpx.post(server.url + "/tokenize", json={"model": "tiny-qwen-vl", "messages": messages},
                         timeout=60).json()
    assert counted["count"] == len(ids)
    chat = ollama.Client(host=server.url, timeout=120).chat(
        model="tiny-qwen-vl", messages=[{"role": "user", "content": QUESTION, "images": [PNG]}],
        options={"temperature": 0, "num_predict": TOKENS})  # greedy: no EOS in these 6
    assert chat.message.content == expected
