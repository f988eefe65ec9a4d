"""Ollama's request and reply shapes turned into OpenAI's and back (pure functions, no I/O).

Ollama's API is a second dialect of the same requests: the routes (routes.py) translate each Ollama body into
the OpenAI body that the chat/completions/embeddings handlers already validate and serve, and translate their
answers back. So a request is validated in one place, and the two APIs give the same answers."""

from __future__ import annotations

import datetime
import json
from typing import Any

from wslm.backend.entrypoints.openai.errors import APIError, bad_request

# Ollama options that map onto OpenAI/vLLM sampling fields.
_SAMPLING_OPTIONS = {
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed",
    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
    "repeat_penalty": "repetition_penalty",
}  # fmt: skip
# Ollama options about llama.cpp's runtime (threads, GPU layers, batch, mmap, ...) or samplers vLLM lacks:
# accepted and ignored, as Ollama itself ignores options a runner does not use.
_RUNTIME_OPTIONS = frozenset({
    "num_keep", "typical_p", "repeat_last_n", "tfs_z", "mirostat", "mirostat_tau", "mirostat_eta",
    "penalize_newline", "numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "vocab_only", "use_mmap",
    "use_mlock", "num_thread", "f16_kv", "logits_all", "embedding_only", "rope_frequency_base",
    "rope_frequency_scale",
})  # fmt: skip


def now() -> str:
    """Ollama's created_at: RFC 3339 with nanoseconds-like precision, UTC."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def sampling_fields(options: Any, max_model_len: int) -> dict:
    """OpenAI fields for Ollama's `options`. num_predict: -1 (unlimited) and -2 (fill the context) leave
    max_tokens to the server (what is left of the context); num_ctx below the model's context keeps the
    prompt's last num_ctx tokens (Ollama truncates the same way); above it the model's own length rules."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise bad_request("options must be an object, such as {\"temperature\": 0.7}.", param="options")
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key in _SAMPLING_OPTIONS:
            if value is not None:
                _number(value, f"options.{key}")
                out[_SAMPLING_OPTIONS[key]] = value
        elif key == "num_predict":
            if value is not None and _integer(value, "options.num_predict") > 0:
                out["max_tokens"] = value
            elif value is not None and value not in (-1, -2) and value <= 0:
                raise bad_request("options.num_predict must be a positive count, -1 (no limit) or -2 (fill the "
                                  f"context), got {value}.", param="options.num_predict")
        elif key == "num_ctx":
            if value is not None and _integer(value, "options.num_ctx") < max_model_len:
                if value < 1:
                    raise bad_request(f"options.num_ctx must be positive, got {value}.", param="options.num_ctx")
                out["truncate_prompt_tokens"] = value
        elif key == "stop":
            if value is not None:
                stops = [value] if isinstance(value, str) else value
                if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
                    raise bad_request("options.stop must be a string or a list of strings.", param="options.stop")
                out["stop"] = stops
        elif key not in _RUNTIME_OPTIONS:
            raise bad_request(f"Unknown option {key!r}. Ollama's sampling options are: "
                              f"{', '.join(sorted([*_SAMPLING_OPTIONS, 'num_predict', 'num_ctx', 'stop']))}.",
                              param=f"options.{key}")
    return out


def _number(value: Any, param: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_request(f"{param} must be a number, got {value!r}.", param=param)
    return value


def _integer(value: Any, param: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{param} must be an integer, got {value!r}.", param=param)
    return value


def response_format(fmt: Any) -> dict | None:
    """Ollama's `format`: "json" (any JSON object) or a JSON schema, as OpenAI's response_format."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "ollama_format", "schema": fmt}}
    raise bad_request(f"format must be \"json\" or a JSON schema object, got {fmt!r}.", param="format")


def with_images(content: Any, images: Any, param: str) -> Any:
    """Ollama's `images` (base64 strings) beside a message's text as OpenAI content parts (images first, as
    Ollama places them), which the chat path reads and checks (frontend/images.py); no images: the text."""
    if not images:
        return content
    if not isinstance(images, list) or not all(isinstance(im, str) for im in images):
        raise bad_request("images must be a list of base64-encoded images.", param=param)
    parts: list[dict] = [{"type": "image_url", "image_url": {"url": "data:image/*;base64," + im}} for im in images]
    if content:
        parts.append({"type": "text", "text": content})
    return parts


def chat_messages(messages: Any) -> list[dict]:
    """Ollama messages as OpenAI's: tool calls get ids (Ollama has none) and each tool result the id of the
    latest unanswered call of its tool_name (or the latest call), so chat templates can pair them."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list of {role, content} objects.", param="messages")
    out: list[dict] = []
    open_calls: list[tuple[str, str]] = []  # (id, name) of calls without a result yet
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise bad_request(f"messages.{i} must be an object with role and content.", param=f"messages.{i}")
        item: dict[str, Any] = {"role": msg.get("role"),
                                "content": with_images(msg.get("content", ""), msg.get("images"), f"messages.{i}.images")}
        if msg.get("thinking"):
            item["reasoning_content"] = msg["thinking"]
        calls = msg.get("tool_calls")
        if calls:
            if not isinstance(calls, list):
                raise bad_request(f"messages.{i}.tool_calls must be a list.", param=f"messages.{i}.tool_calls")
            item["tool_calls"] = []
            for k, call in enumerate(calls):
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise bad_request(f"messages.{i}.tool_calls.{k} needs function.name.",
                                      param=f"messages.{i}.tool_calls.{k}")
                args = fn.get("arguments", {})
                call_id = f"call_{i}_{k}"
                item["tool_calls"].append({"id": call_id, "type": "function", "function": {
                    "name": fn["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}})
                open_calls.append((call_id, fn["name"]))
        if msg.get("role") == "tool":
            name = msg.get("tool_name") or msg.get("name")
            match = next((c for c in open_calls if c[1] == name), open_calls[-1] if open_calls else None)
            if match is not None:
                open_calls.remove(match)
                item["tool_call_id"] = match[0]
            if name:
                item["name"] = name
        out.append(item)
    return out


def ollama_message(message: dict) -> dict:
    """An OpenAI assistant message as Ollama's: thinking apart, tool call arguments as objects."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    thinking = message.get("reasoning_content") or message.get("reasoning")
    if thinking:
        out["thinking"] = thinking
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [{"function": {"name": c["function"]["name"],
                                           "arguments": _arguments(c["function"].get("arguments"))}}
                             for c in calls]
    return out


def _arguments(text: Any) -> Any:
    if not isinstance(text, str):
        return text or {}
    try:
        return json.loads(text) if text.strip() else {}
    except ValueError:
        return {"__raw": text}  # a cut call (max_tokens): the text as the model wrote it


def done_reason(finish: str | None) -> str:
    """Ollama knows stop, length, load and unload: a tool call ends with "stop" there."""
    return "length" if finish == "length" else "stop"


def timings(usage: dict | None, started: float, first_token: float | None, ended: float) -> dict:
    """Ollama's counters in nanoseconds: prompt evaluation until the first token, then generation."""
    usage = usage or {}
    first = first_token if first_token is not None else ended
    return {
        "total_duration": int((ended - started) * 1e9),
        "load_duration": 0,
        "prompt_eval_count": usage.get("prompt_tokens", 0),
        "prompt_eval_duration": int((first - started) * 1e9),
        "eval_count": usage.get("completion_tokens", 0),
        "eval_duration": int((ended - first) * 1e9),
    }


def error_text(body: bytes | str) -> str:
    """The message of an OpenAI error body, for Ollama's {"error": "..."}."""
    try:
        data = json.loads(body)
        error = data.get("error")
        return error.get("message", str(error)) if isinstance(error, dict) else str(error or data)
    except (ValueError, AttributeError):
        return body.decode(errors="replace") if isinstance(body, bytes) else body


def require_model(body: dict) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise APIError("model is required: the name of a model this server serves (GET /api/tags lists them).",
                       400, param="model")
    return model


def size_label(num_params: int | None) -> str:
    """Ollama's parameter_size: "135M", "3.2B"."""
    if not num_params:
        return ""
    if num_params >= 1e9:
        return f"{num_params / 1e9:.1f}B"
    return f"{round(num_params / 1e6)}M"
