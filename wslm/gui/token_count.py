"""How many tokens a text or a chat takes for the chat's model: asked of its server's /tokenize (vLLM's and
wslm's: the model's own tokenizer and chat template, exact), else estimated from UTF-8 bytes.

Blocking (HTTP): worker threads only. The estimate is only for servers without /tokenize (LM Studio,
Ollama's OpenAI API). Measured on the demo model's tokenizer (SmolLM2, a 49k BPE like most chat models';
2026-12-07, this repository's files): plain English prose 4.3-4.5 bytes a token, Markdown docs 3.0-3.7,
Python 3.6, German 2.8, and digits 1.0 (SmolLM2 splits numbers into single digits). No ratio is safe for
every text short of 1 byte a token, which would count prose four times over; the estimate takes 2 bytes a
token (context_fit's lenient bound): it under-counts only digit-heavy text, and over-counting prose only
cuts more of a document, which is then said. The old fit check used the same 2 bytes a token for our own
server too, where it left a 24 KB file (6020 tokens) out of an 8k context it fitted: there /tokenize counts."""

from __future__ import annotations

import math

import httpx

from wslm.gui.content_parts import IMAGE_TOKEN_ESTIMATE, image_count, text_of
from wslm.gui.context_fit import LENIENT_BYTES_PER_TOKEN, MESSAGE_OVERHEAD, PROMPT_OVERHEAD

ESTIMATE_BYTES_PER_TOKEN = LENIENT_BYTES_PER_TOKEN


def estimate_text(text: str) -> int:
    return math.ceil(len(text.encode("utf-8")) / ESTIMATE_BYTES_PER_TOKEN)


def estimate_chat(messages: list[dict]) -> int:
    return PROMPT_OVERHEAD + sum(estimate_text(text_of(m.get("content"))) + MESSAGE_OVERHEAD
                                 + image_count(m.get("content")) * IMAGE_TOKEN_ESTIMATE for m in messages)


def server_root(base_url: str) -> str:
    """http://host:port/v1 -> http://host:port (vLLM serves /tokenize beside /v1, not under it)."""
    base = base_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


class TokenCounter:
    """Counts for one server and model. After the first failed /tokenize call (an older or another kind of
    server) it estimates for the rest of its life, without asking again."""

    def __init__(self, base_url: str, model: str, api_key: str = "", timeout: float = 30.0) -> None:
        self.url = server_root(base_url) + "/tokenize" if base_url else ""
        self.model = model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = timeout
        self.exact = bool(self.url)  # False: estimating
        self.context: int | None = None  # the server's max_model_len, as /tokenize reports it
        self._client: httpx.Client | None = None

    def text(self, text: str) -> int:
        """Tokens of `text` inside a prompt (no special tokens added)."""
        n = self._ask({"prompt": text, "add_special_tokens": False})
        return estimate_text(text) if n is None else n

    def chat(self, messages: list[dict]) -> int:
        """Tokens of the whole prompt `messages` render to, the generation prompt included."""
        n = self._ask({"messages": messages, "add_generation_prompt": True})
        return estimate_chat(messages) if n is None else n

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _ask(self, body: dict) -> int | None:
        if not self.exact:
            return None
        try:
            if self._client is None:
                self._client = httpx.Client(timeout=httpx.Timeout(self.timeout, connect=5.0))
            resp = self._client.post(self.url, json={"model": self.model, **body}, headers=self.headers)
            if resp.status_code >= 400:
                raise ValueError(resp.status_code)
            data = resp.json()
            if isinstance(data.get("max_model_len"), int):
                self.context = data["max_model_len"]
            return int(data["count"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
            self.exact = False
            return None
