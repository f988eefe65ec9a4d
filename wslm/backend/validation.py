"""Checks a request before it reaches the engine, with messages a user can act on."""

from __future__ import annotations

from wslm.backend.sampling_params import SamplingParams


def validate_prompt(
    prompt, params: SamplingParams, tokenizer, max_model_len: int, vocab_size: int
) -> tuple[str | None, list[int]]:
    """Returns (prompt text or None, token ids). Sets params.max_tokens when it was None."""
    text: str | None = None
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            ids = prompt["prompt_token_ids"]
        elif "prompt" in prompt:
            text = prompt["prompt"]
            ids = None
        else:
            raise ValueError("A prompt dict needs 'prompt' (text) or 'prompt_token_ids' (a list of ints).")
    elif isinstance(prompt, str):
        text, ids = prompt, None
    elif isinstance(prompt, (list, tuple)):
        ids = prompt
    else:
        raise ValueError(f"A prompt must be text, a list of token ids or a dict, not {type(prompt).__name__}.")
    if ids is None:
        if not isinstance(text, str):
            raise ValueError("The prompt text must be a string.")
        if not text:
            raise ValueError("The prompt is empty: send at least one token of text.")
        ids = tokenizer.encode(text)
    ids = list(ids)
    if not ids:
        raise ValueError("The prompt is empty: send at least one token.")
    if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 or t >= vocab_size for t in ids):
        raise ValueError(f"Prompt token ids must be integers in [0, {vocab_size}).")
    n = len(ids)
    if n >= max_model_len:
        raise ValueError(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt has {n} "
            f"tokens, which leaves no room for the completion. Shorten the prompt or start the server with a "
            f"larger --max-model-len."
        )
    if params.max_tokens is None:
        params.max_tokens = max_model_len - n
    elif n + params.max_tokens > max_model_len:
        raise ValueError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{n + params.max_tokens} tokens ({n} in the prompt, {params.max_tokens} for the completion). "
            f"Reduce the prompt or max_tokens (at most {max_model_len - n} here)."
        )
    return text, ids
