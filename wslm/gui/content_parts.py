"""Images in chat messages, as data (no Qt): the image a message carries, and OpenAI content parts.

A user message with images goes out as content parts, the text first (as LM Studio and Jan send it):
[{"type": "text", "text": ...}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}].
The helpers here read such content wherever the chat handles a message's text (fitting the context, the
documents' passages, the developer view), so a message with images is never turned into its repr."""

from __future__ import annotations

import base64
import copy
from dataclasses import dataclass

# About how many tokens an image takes in a prompt, for the context meter and the fit check: vision
# towers give an image from 64 (SmolVLM) to a few hundred (Gemma 3: 256, Qwen2.5-VL: up to ~1000 at 1 MP).
IMAGE_TOKEN_ESTIMATE = 512


@dataclass
class ChatImage:
    """One image of a message: its encoded bytes (PNG or JPEG, as sent) and a small PNG thumbnail."""

    mime: str
    data: bytes
    name: str = ""
    thumb: bytes = b""
    width: int = 0
    height: int = 0

    def data_url(self) -> str:
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode()}"

    def thumb_url(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.thumb or self.data).decode()

    def part(self) -> dict:
        return {"type": "image_url", "image_url": {"url": self.data_url()}}


def message_content(text: str, images: list[ChatImage] | None) -> str | list[dict]:
    """A message's content: the text alone, or (with images) the text part (if any) then one image_url part each."""
    if not images:
        return text
    return ([{"type": "text", "text": text}] if text else []) + [im.part() for im in images]


def text_of(content) -> str:
    """The text of a message's content (its text parts joined, for content parts)."""
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content or "")


def with_text(content, text: str):
    """`content` with its text replaced by `text` (content parts keep their images)."""
    if not isinstance(content, list):
        return text
    rest = [p for p in content if not (isinstance(p, dict) and p.get("type") == "text")]
    return [{"type": "text", "text": text}, *rest]


def image_count(content) -> int:
    return sum(1 for p in content if isinstance(p, dict) and p.get("type") == "image_url") \
        if isinstance(content, list) else 0


def has_images(messages: list[dict]) -> bool:
    return any(image_count(m.get("content")) for m in messages)


def content_bytes(content) -> int:
    """The UTF-8 size of a content's text, with each image counted as IMAGE_TOKEN_ESTIMATE tokens' worth of
    bytes at 4 bytes a token (its base64 is not what the model reads)."""
    return len(text_of(content).encode()) + image_count(content) * IMAGE_TOKEN_ESTIMATE * 4


def elide_images(body: dict) -> dict:
    """A request body with each data: URL shortened to its type and size (the developer view shows bodies
    as text: megabytes of base64 would make it crawl and say nothing)."""
    if not has_images(body.get("messages") or []):
        return body
    out = copy.deepcopy(body)
    for m in out.get("messages") or []:
        for p in m.get("content") if isinstance(m.get("content"), list) else []:
            url = p.get("image_url", {}).get("url", "") if isinstance(p, dict) else ""
            if url.startswith("data:") and "," in url:
                head, data = url.split(",", 1)
                size = len(data) * 3 // 4 - len(data) + len(data.rstrip("="))
                p["image_url"]["url"] = f"{head},…({size:,} bytes)"
    return out


IMAGES_REFUSED_HINT = (" The model may not take images: your message and its images are kept. Serve a model that "
                       "sees images (Qwen2.5-VL, Gemma 3, SmolVLM) and Retry, or Edit the message and remove them.")


def explain_refusal(message: str, messages: list[dict]) -> str:
    """A server's 4xx to a request with images: say that the images may be why, and that nothing is lost."""
    if has_images(messages) and "answered 4" in message and IMAGES_REFUSED_HINT not in message:
        return message.rstrip() + IMAGES_REFUSED_HINT
    return message
