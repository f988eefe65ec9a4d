"""Images in chat through a real `wslm serve` on a tiny random LLaVA written by the test: a PNG as a data: URL
through the official `openai` client (chat and Responses), `anthropic` (an image block) and `ollama`
(images=[bytes]) all get HF transformers' greedy answer; http(s) image URLs are fetched from a loopback server
(with a timeout and a size cap); every limit answers 400 naming the limit and its flag."""

from __future__ import annotations

import http.server
import threading
import time

import anthropic
import httpx
import ollama
import openai
import pytest
from test_server_helpers import SMALL, ServerProcess
from vision_helpers import data_url, hf_greedy_top, image_bytes, make_tiny_llava, noise_image, tiny_tokenizer

QUESTION = "What is it?"
TOKENS = 6
IMG = noise_image(40, 50, 0)
PNG = image_bytes(IMG)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_llava(tmp_path_factory.mktemp("llava"))


@pytest.fixture(scope="module")
def server(folder):
    srv = ServerProcess(str(folder), "--port", "0", *SMALL, "--max-model-len", "512", "--dtype", "float32",
                        "--served-model-name", "tiny-vlm",
                        "--limit-mm-per-prompt", '{"image": 2}', "--max-image-bytes", "20000",
                        "--max-image-pixels", "10000", "--image-fetch-timeout", "1")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def expected(folder) -> str:
    """HF transformers' greedy reply to the image and the question."""
    _, top = hf_greedy_top(folder, [{"role": "user", "content": [{"type": "image"}, {"type": "text",
                                                                                     "text": QUESTION}]}],
                           [IMG], TOKENS, k=1)
    return tiny_tokenizer().decode([next(iter(step)) for step in top], skip_special_tokens=True)


class _Images(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path == "/slow.png":
            time.sleep(3)  # longer than the server's --image-fetch-timeout 1
        body = {"/img.png": PNG, "/slow.png": PNG, "/big.png": b"\0" * 30000}.get(self.path)
        if body is None:
            self.send_error(404)
            return
        try:
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            if self.path != "/big.png":  # no Content-Length: the cap must hold while reading
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server gave up on the slow one, as it should

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def image_host():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _parts(*urls: str, text: str = QUESTION) -> list[dict]:
    return [*({"type": "image_url", "image_url": {"url": u}} for u in urls), {"type": "text", "text": text}]


def _chat(client, content, **extra):
    return client.chat.completions.create(model="tiny-vlm", messages=[{"role": "user", "content": content}],
                                          max_tokens=TOKENS, temperature=0, **extra)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120)


def test_png_through_openai_responses_anthropic_and_ollama(server, client, expected):
    reply = _chat(client, _parts(data_url(PNG)))
    assert reply.choices[0].message.content == expected
    assert reply.usage.prompt_tokens > 16  # the image's 16 placeholder tokens are counted
    # /tokenize (the desktop app's context meter) counts a chat with an image as the engine runs it.
    counted = httpx.post(server.url + "/tokenize", json={"model": "tiny-vlm", "messages": [
        {"role": "user", "content": _parts(data_url(PNG))}]}, timeout=60).json()
    assert counted["count"] == reply.usage.prompt_tokens
    stream = _chat(client, _parts(data_url(PNG)), stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected
    resp = client.responses.create(model="tiny-vlm", max_output_tokens=TOKENS, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": data_url(PNG)},
                                     {"type": "input_text", "text": QUESTION}]}])
    assert resp.output_text == expected
    msg = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0).messages.create(
        model="tiny-vlm", max_tokens=TOKENS, extra_body={"temperature": 0}, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": data_url(PNG).split(",", 1)[1]}},
            {"type": "text", "text": QUESTION}]}])
    assert "".join(b.text for b in msg.content if b.type == "text") == expected
    oll = ollama.Client(host=server.url, timeout=120)
    options = {"temperature": 0, "num_predict": TOKENS}
    chat = oll.chat(model="tiny-vlm", messages=[{"role": "user", "content": QUESTION, "images": [PNG]}],
                    options=options)
    assert chat.message.content == expected
    gen = oll.generate(model="tiny-vlm", prompt=QUESTION, images=[PNG], options=options)
    assert gen.response == expected
    assert "vision" in oll.show("tiny-vlm").capabilities  # what Open WebUI reads to offer image upload


def test_gif_first_frame_and_http_url(client, image_host, expected):
    from PIL import Image

    frames = [IMG, Image.new("RGB", (40, 50), (255, 0, 0))]
    buf = __import__("io").BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:])
    assert _chat(client, _parts(data_url(buf.getvalue(), "image/gif"))).choices[0].message.content
    assert _chat(client, _parts(image_host + "/img.png")).choices[0].message.content == expected


@pytest.mark.parametrize("case,flag", [
    ("count", "--limit-mm-per-prompt"),
    ("bytes", "--max-image-bytes"),
    ("pixels", "--max-image-pixels"),
    ("format", "PNG, JPEG, WebP or GIF"),
    ("base64", "base64"),
    ("scheme", "data: or http(s)"),
    ("slow", "--image-fetch-timeout"),
    ("big_download", "--max-image-bytes"),
    ("missing", "could not be fetched"),
])
def test_each_limit_is_a_400_naming_it(client, image_host, case, flag):
    from PIL import Image

    small = data_url(PNG)
    content = {
        "count": _parts(small, small, small),
        "bytes": _parts(data_url(image_bytes(noise_image(120, 120, 3)))),
        "pixels": _parts(data_url(image_bytes(Image.new("RGB", (200, 100))))),
        "format": _parts(data_url(image_bytes(Image.new("RGB", (8, 8)), "BMP"), "image/bmp")),
        "base64": _parts("data:image/png;base64,###"),
        "scheme": _parts("file:///etc/passwd"),
        "slow": _parts(image_host + "/slow.png"),
        "big_download": _parts(image_host + "/big.png"),
        "missing": _parts(image_host + "/nothing.png"),
    }[case]
    with pytest.raises(openai.BadRequestError) as err:
        _chat(client, content)
    assert flag in err.value.message
    assert err.value.body["param"].startswith("messages")


def test_server_still_serves_text_and_placeholder_text_is_refused(server, client):
    assert _chat(client, "Plain text, no image.").choices[0].message.content is not None
    with pytest.raises(openai.BadRequestError, match="use_beam_search does not take images"):
        _chat(client, _parts(data_url(PNG)), extra_body={"use_beam_search": True, "n": 2})
    # The placeholder token typed as text, with no image behind it, is a 400, not garbage embeddings.
    r = httpx.post(server.base_url + "/completions", json={"model": "tiny-vlm", "prompt": "USER: <image>\nhi",
                                                           "max_tokens": 2}, timeout=60)
    assert r.status_code == 400 and "no image" in r.json()["error"]["message"]
