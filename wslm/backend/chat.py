"""Chat prompts through the model's own chat template (or an override)."""

from __future__ import annotations

from pathlib import Path

_ROLES = {"system", "user", "assistant", "tool", "developer"}


def normalize_messages(messages) -> list[dict]:
    """Accepts OpenAI-style messages; content may be a string or a list of text parts."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} objects.")
    result = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or "role" not in msg:
            raise ValueError(f"messages[{i}] must be an object with 'role' and 'content'.")
        role = msg["role"]
        if role not in _ROLES:
            raise ValueError(f"messages[{i}].role must be one of {sorted(_ROLES)}, got {role!r}.")
        content = msg.get("content")
        if content is None:
            content = ""
        elif isinstance(content, list):
            parts = []
            for part in content:
                if isinstance(part, dict) and part.get("type") == "text":
                    parts.append(str(part.get("text", "")))
                elif isinstance(part, str):
                    parts.append(part)
                else:
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise ValueError(f"messages[{i}] has a {kind!r} content part; only text parts are supported.")
            content = "".join(parts)
        elif not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string or a list of text parts.")
        result.append({"role": role, "content": content})
    return result


def render_chat(tokenizer, messages, template: str | None, add_generation_prompt: bool, model_name: str) -> list[int]:
    template = template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError(
            f"The model {model_name!r} has no chat template, so chat messages cannot be turned into a prompt. "
            "Pass one with --chat-template FILE (a Jinja template), or use /v1/completions with a plain prompt."
        )
    text = tokenizer.apply_chat_template(
        normalize_messages(messages),
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        chat_template=template,
    )
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
