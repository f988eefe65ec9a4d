"""A real `wslm serve model.gguf --mmproj mmproj.gguf` (llama.cpp's split of a tiny random LLaVA-1.5,
tests/mmproj_helpers.py): a PNG through the official `openai` client gets HF transformers' greedy reply, the
`ollama` client's show lists the vision capability. (A projector wslm does not run, or one of another model,
stops the start in LLMEngine: tests/test_mmproj.py.)"""

from __future__ import annotations

import ollama
import openai
import pytest
from mmproj_helpers import llava_pair_files
from test_server_helpers import SMALL, ServerProcess
from vision_helpers import (
    data_url,
    hf_greedy_top,
    image_bytes,
    noise_image,
    tiny_tokenizer,
)

TOKENS = 6
IMG = noise_image(28, 28, 5)  # the tower's own size: both paths only normalize it


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return llava_pair_files(tmp_path_factory.mktemp("mmproj-serve"))


@pytest.fixture(scope="module")
def server(files):
    _, model, mmproj, tok = files
    srv = ServerProcess(str(model), "--mmproj", str(mmproj), "--tokenizer", str(tok), "--port", "0", *SMALL, "--max-model-len", "512",
                        "--dtype", "float32", "--served-model-name", "tiny-gguf-vlm",
                        env={"WSLM_GGUF_CACHE": "0"})
    yield srv
    srv.stop()


def test_openai_image_chat_and_ollama_vision(files, server):
    folder = files[0]
    ids, top = hf_greedy_top(folder, [{"role": "user", "content": [{"type": "image"},
                                                                   {"type": "text", "text": "What is it?"}]}],
                             [IMG], TOKENS, k=1)
    expected = tiny_tokenizer().decode([next(iter(step)) for step in top], skip_special_tokens=True)
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120)
    reply = client.chat.completions.create(
        model="tiny-gguf-vlm", max_tokens=TOKENS, temperature=0,
        messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url(image_bytes(IMG))}},
            {"type": "text", "text": "What is it?"}]}])
    assert reply.choices[0].message.content == expected
    assert reply.usage.prompt_tokens == len(ids)  # the image's 16 tokens at the media marker, as HF's <image>
    shown = ollama.Client(host=server.url, timeout=120).show("tiny-gguf-vlm")
    assert "vision" in shown.capabilities
