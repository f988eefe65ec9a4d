"""Chat prompts through the model's own chat template (or an override).

The one rendering path: LLM.chat, `wslm chat` and the server's /v1/chat/completions, /tokenize and /v1/messages
all call render_chat(), so the same messages give the same prompt token ids everywhere."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from jinja2.exceptions import TemplateError

from wslm.backend.frontend.chat_harmony import HARMONY_MARK, harmony_messages
from wslm.backend.frontend.images import IMAGE_PARTS, image_source
from wslm.backend.frontend.validation import RequestError

# Content part types that carry text (OpenAI's chat parts and its Responses-style input parts).
_TEXT_PARTS = ("text", "input_text")


class ImagesRefused(RequestError):
    """An image part sent to a model that does not take images (render_chat_text names the model)."""

    def __init__(self, where: str) -> None:
        super().__init__("This model does not take images.", param=where, code="images_not_supported")


def images_refused(model_name: str, where: str) -> RequestError:
    return RequestError(f"The model {model_name!r} does not take images; load a vision model (a LLaVA-1.5 style "
                        "checkpoint such as llava-hf/llava-1.5-7b-hf, or a GGUF with its mmproj file: --mmproj; "
                        "see docs/vision.md) or send text only.",
                        param=where, code="images_not_supported")


def normalize_messages(messages: Any, images: list | None = None) -> list[dict]:
    """OpenAI-style messages as chat templates want them. Any role goes to the template as given (vLLM does
    the same) except OpenAI's `developer`, which templates know as `system`; content may be a string or a list
    of text parts (joined with newlines, as vLLM joins them); assistant `tool_calls` keep their ids and get
    their JSON `arguments` string decoded into an object, which is what Hermes, Llama and Mistral templates
    expect; `tool_call_id`, `name` and any other field pass through.

    images: a list given by a vision model's caller: image parts (image_url, input_image) are appended to it as
    (url, field) and every content becomes a list of {"type": "text"} / {"type": "image"} parts, as vision
    templates read them (they write one image placeholder per image part). Without it image parts are kept
    out of the text and appended to the list the caller checks (see _render)."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise RequestError("messages must be a non-empty list of {'role': ..., 'content': ...} objects.",
                           param="messages")
    return [_normalize_message(i, msg, images) for i, msg in enumerate(messages)]


def _normalize_message(i: int, msg: Any, images: list | None = None) -> dict:
    if not isinstance(msg, dict) or "role" not in msg:
        raise RequestError(f"messages[{i}] must be an object with 'role' and 'content'.", param=f"messages.{i}")
    role = msg["role"]
    if not isinstance(role, str) or not role.strip():
        raise RequestError(f"messages[{i}].role must be a non-empty string such as 'user', got {role!r}.",
                           param=f"messages.{i}.role")
    out = {k: v for k, v in msg.items() if v is not None}
    out["role"] = "system" if role == "developer" else role
    content = msg.get("content")
    tool_calls = msg.get("tool_calls")
    if content is None:
        if role != "assistant":
            raise RequestError(f"messages[{i}].content is required for role {role!r}.", param=f"messages.{i}.content")
        content = ""  # an assistant turn that only called tools
    elif isinstance(content, list):
        texts = []
        parts: list[dict] = []  # the content as a vision template reads it
        for j, part in enumerate(content):
            if isinstance(part, str):
                texts.append(part)
                parts.append({"type": "text", "text": part})
            elif isinstance(part, dict) and part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str):
                texts.append(part["text"])
                parts.append({"type": "text", "text": part["text"]})
            elif isinstance(part, dict) and part.get("type") in IMAGE_PARTS:
                where = f"messages.{i}.content.{j}"
                if images is None:
                    raise ImagesRefused(where)
                images.append((image_source(part, where), where))
                parts.append({"type": "image"})
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RequestError(f"messages[{i}] has a {kind!r} content part; only text and image parts are "
                                   "supported.", param=f"messages.{i}.content", code="unsupported_parameter")
        content = parts if images is not None else "\n".join(texts)
    elif not isinstance(content, str):
        raise RequestError(f"messages[{i}].content must be a string or a list of text parts.",
                           param=f"messages.{i}.content")
    if images is not None and isinstance(content, str):
        content = [{"type": "text", "text": content}] if content else content
    out["content"] = content
    if tool_calls:
        out["tool_calls"] = [_template_tool_call(i, j, call) for j, call in enumerate(tool_calls)]
    return out


def _with_marker(msg: dict, marker: str) -> dict:
    content = msg.get("content")
    if not isinstance(content, list):
        return msg
    text = "\n".join(p["text"] if p.get("type") == "text" else marker for p in content)
    return {**msg, "content": text}


def _template_tool_call(i: int, j: int, call: Any) -> dict:
    where = f"messages[{i}].tool_calls[{j}]"
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise RequestError(f"{where} must look like {{'id': ..., 'type': 'function', 'function': {{'name': ..., "
                           "'arguments': '<JSON>'}}.", param=f"messages.{i}.tool_calls")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError as exc:
            raise RequestError(f"{where}.function.arguments is not valid JSON: {exc}.",
                               param=f"messages.{i}.tool_calls") from exc
    if args is None:
        args = {}  # "null" arguments: a call without any
    if not isinstance(args, dict):
        raise RequestError(f"{where}.function.arguments must be a JSON object (as a string, as OpenAI sends it), "
                           f"got {type(args).__name__}.", param=f"messages.{i}.tool_calls")
    return {**call, "type": call.get("type", "function"), "function": {**fn, "arguments": args}}


# Mistral's templates refuse any tool call id that is not 9 alphanumeric characters (raise_exception in the
# Jinja); OpenAI-style ids ("call_...", and ours) are longer, so every tool round-trip would fail.
_NINE_CHAR_IDS = "id|length!=9"


def _nine_char_tool_call_ids(messages: list[dict]) -> list[dict]:
    """Each tool call id, and the tool_call_id answering it, as 9 alphanumeric characters (a stable hash, so a
    call and its result still match), as vLLM shortens them for Mistral models."""
    def short(value: Any) -> Any:
        if not isinstance(value, str) or (len(value) == 9 and value.isalnum()):
            return value
        return hashlib.sha256(value.encode()).hexdigest()[:9]

    out = []
    for msg in messages:
        msg = dict(msg)
        if msg.get("tool_calls"):
            msg["tool_calls"] = [{**c, "id": short(c.get("id"))} for c in msg["tool_calls"]]
        if "tool_call_id" in msg:
            msg["tool_call_id"] = short(msg["tool_call_id"])
        out.append(msg)
    return out


def pick_template(template: str | dict | None, tools: list[dict] | None = None) -> str | None:
    """The template to use. A tokenizer may carry several named ones (a dict, e.g. Hermes 3's "default" and
    "tool_use"): "tool_use" when tools are sent, else "default", as transformers picks."""
    if not isinstance(template, dict):
        return template
    if tools and "tool_use" in template:
        return template["tool_use"]
    if "default" in template:
        return template["default"]
    raise RequestError(f"The model has several chat templates ({', '.join(template)}) and none is named "
                       "'default': pass one with --chat-template FILE.", param="messages")


def template_text(template: str | dict | None) -> str:
    """All of a model's template text (every named template), for telling which tool format it uses."""
    return "\n".join(template.values()) if isinstance(template, dict) else (template or "")


def render_chat_text(tokenizer: Any, messages: Any, template: str | None, model_name: str, *,
                     add_generation_prompt: bool = True, continue_final_message: bool = False,
                     tools: list[dict] | None = None, chat_template_kwargs: dict | None = None,
                     images: list | None = None, media_marker: str | None = None) -> str:
    """The prompt text for a chat. chat_template_kwargs (e.g. {"enable_thinking": False}) reach the template as
    variables; tools (OpenAI's [{"type": "function", "function": {...}}]) too, as the template's `tools`.
    images: a vision model's list that receives each image part's (url, field) (normalize_messages); None:
    the model takes no images and an image part is a 400 naming it. media_marker: a GGUF with an mmproj file
    (mmproj_prompts.py): each content list becomes text, an image part the marker, as llama-server does."""
    template = pick_template(template or getattr(tokenizer, "chat_template", None), tools)
    if not template:
        raise RequestError(
            f"The model {model_name!r} has no chat template, so chat messages cannot be turned into a prompt. "
            "Pass one with --chat-template FILE (a Jinja template), or use /v1/completions with a plain prompt.",
            param="messages",
        )
    if continue_final_message and add_generation_prompt:
        raise RequestError("continue_final_message and add_generation_prompt cannot both be true: set "
                           "add_generation_prompt=false to continue the last assistant message.",
                           param="continue_final_message")
    try:
        normalized = normalize_messages(messages, images)
    except ImagesRefused as exc:
        raise images_refused(model_name, exc.param) from None
    if media_marker:
        normalized = [_with_marker(m, media_marker) for m in normalized]
    if _NINE_CHAR_IDS in str(template).replace(" ", ""):
        normalized = _nine_char_tool_call_ids(normalized)
    if HARMONY_MARK in str(template):
        normalized = harmony_messages(normalized)  # gpt-oss: one tool call per message, `thinking`
    if continue_final_message and normalized[-1]["role"] != "assistant":
        raise RequestError("continue_final_message needs the last message to be an assistant message.",
                           param="continue_final_message")
    extra = dict(chat_template_kwargs or {})
    # These are ours to set; a template variable of the same name in chat_template_kwargs would be ambiguous.
    for reserved in ("tokenize", "chat_template", "add_generation_prompt", "continue_final_message", "tools"):
        if reserved in extra:
            raise RequestError(f"chat_template_kwargs must not set {reserved!r}; use the request field instead.",
                               param="chat_template_kwargs")
    try:
        return tokenizer.apply_chat_template(
            normalized,
            tools=tools or None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            chat_template=template,
            **extra,
        )
    except TemplateError as exc:
        # A template's raise_exception (e.g. "Conversation roles must alternate user/assistant", an unknown
        # role): the messages are what the client can change, so a 400 with the template's own words.
        raise RequestError(f"The chat template of {model_name!r} refused these messages: {exc}. Change the "
                           "messages (roles, their order) or pass another template with chat_template.",
                           param="messages") from None


def render_chat(tokenizer: Any, messages: Any, template: str | None, add_generation_prompt: bool, model_name: str,
                vision: Any = None, **options: Any) -> list[int]:
    """The prompt token ids for a chat (render_chat_text's options). vision: a vision model's VisionPrompts
    (vision_prompts.py); with images the ids are a PromptIds carrying them."""
    sources: list | None = [] if vision is not None else None
    text = render_chat_text(tokenizer, messages, template, model_name, add_generation_prompt=add_generation_prompt,
                            images=sources, media_marker=getattr(vision, "media_marker", None), **options)
    if sources:  # a vision model's processor expands each image's placeholder and reads its pixels
        return vision.prompt(text, vision.load_images(sources))
    # The template already wrote any BOS token; encoding must not add a second one.
    return tokenizer.encode(text, add_special_tokens=False)


def read_template(value: str | None) -> str | None:
    """A chat template given inline, or as a path to a Jinja file."""
    if not value:
        return None
    if "{" not in value and len(value) < 4096:
        path = Path(value).expanduser()
        if path.is_file():
            return path.read_text(encoding="utf-8")
        raise FileNotFoundError(f"Chat template file {value} not found (give a Jinja file or the template text).")
    return value
