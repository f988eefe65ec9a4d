"""--speculative-config: vLLM's JSON ({"method": "ngram", ...} or {"model": PATH, ...}) checked once, with
errors that say what to change. No torch here (EngineConfig imports it)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_SPECULATIVE_TOKENS = 16  # more than this is never faster: each rejected token is wasted target compute
METHODS = ("ngram", "draft_model")
_KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"}
# vLLM keys that only tune what wslm decides itself: accepted and ignored, so a vLLM config works unchanged.
_IGNORED = {"draft_tensor_parallel_size", "disable_by_batch_size", "quantization", "max_model_len", "revision",
            "code_revision", "disable_padded_drafter_batch", "speculative_token_tree", "enforce_eager"}
_EXAMPLE = ('e.g. --speculative-config \'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}\' '
            'or \'{"model": "PATH_OR_ID", "num_speculative_tokens": 4}\'')


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: str  # "ngram" or "draft_model"
    num_speculative_tokens: int
    model: str | None = None  # the draft model (draft_model)
    prompt_lookup_max: int = 5  # n-gram: the longest suffix looked up in the context...
    prompt_lookup_min: int = 5  # ...and the shortest

    def describe(self) -> str:
        if self.method == "ngram":
            return (f"n-gram prompt lookup, {self.num_speculative_tokens} tokens per step, n-grams of "
                    f"{self.prompt_lookup_min}..{self.prompt_lookup_max}")
        return f"draft model {self.model}, {self.num_speculative_tokens} tokens per step"


def parse_speculative_config(value: Any) -> SpeculativeConfig | None:
    """A dict, its JSON text, or None (off). Raises ValueError naming the fix."""
    if value is None or isinstance(value, SpeculativeConfig):
        return value
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"speculative_config is not valid JSON ({exc.msg} at character {exc.pos}); "
                             f"{_EXAMPLE}.") from None
    if not isinstance(value, dict):
        raise ValueError(f"speculative_config must be a JSON object, got {type(value).__name__}; {_EXAMPLE}.")
    unknown = sorted(set(value) - _KEYS - _IGNORED)
    if unknown:
        raise ValueError(f"speculative_config: unknown key(s) {', '.join(unknown)}; wslm reads "
                         f"{', '.join(sorted(_KEYS))}.")
    model = value.get("model")
    method = value.get("method")
    if method is None:
        method = "ngram" if model in (None, "[ngram]", "ngram") else "draft_model"
    if method == "[ngram]" or model in ("[ngram]", "ngram"):
        method, model = "ngram", None
    if method in ("draft", "draft_model"):
        method = "draft_model"
    if method not in METHODS:
        raise ValueError(f"speculative_config: unknown method {method!r}. wslm speculates with \"ngram\" (prompt "
                         "lookup, no second model) or \"draft_model\" (give \"model\": a smaller model with the same "
                         "tokenizer); vLLM's eagle/medusa/mtp heads are not supported.")
    if method == "draft_model" and not model:
        raise ValueError('speculative_config: method "draft_model" needs "model": the path or id of a smaller model '
                         "with the same tokenizer.")
    if method == "ngram" and model:
        raise ValueError('speculative_config: method "ngram" takes no "model" (it looks up the context itself); drop '
                         '"model", or use "method": "draft_model".')
    k = value.get("num_speculative_tokens")
    if k is None:
        raise ValueError(f"speculative_config needs num_speculative_tokens (1..{MAX_SPECULATIVE_TOKENS}), "
                         f"{_EXAMPLE}.")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise ValueError(f"speculative_config: num_speculative_tokens must be an integer from 1 to "
                         f"{MAX_SPECULATIVE_TOKENS}, got {k!r} (2 to 5 is usual).")
    lo, hi = value.get("prompt_lookup_min"), value.get("prompt_lookup_max")
    if method != "ngram" and (lo is not None or hi is not None):
        raise ValueError("speculative_config: prompt_lookup_min/max are for method \"ngram\" only; drop them.")
    for name, v in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 64):
            raise ValueError(f"speculative_config: {name} must be an integer from 1 to 64, got {v!r}.")
    # As vLLM: neither given is 5 and 5; one given sets the other. Short n-grams recur by chance in any text,
    # and each wrong proposal costs a verification row (bench/spec_decode.py measures it).
    if hi is None and lo is None:
        hi = lo = 5
    hi = hi if hi is not None else lo
    lo = lo if lo is not None else hi
    if lo > hi:
        raise ValueError(f"speculative_config: prompt_lookup_min ({lo}) is larger than prompt_lookup_max ({hi}); "
                         "make min <= max.")
    return SpeculativeConfig(method, k, str(model) if model else None, hi, lo)


def fold_legacy_flags(config: Any, model: str | None, k: int | None, lookup_max: int | None,
                      lookup_min: int | None) -> Any:
    """vLLM's older --speculative-model / --num-speculative-tokens / --ngram-prompt-lookup-max|min as one
    speculative_config (the JSON flag wins where both say something); config unchanged when none is given."""
    if model is None and k is None and lookup_max is None and lookup_min is None:
        return config
    if config is not None:
        raise ValueError("give either --speculative-config or the older --speculative-model / "
                         "--num-speculative-tokens / --ngram-prompt-lookup-* flags, not both.")
    if model is None:
        raise ValueError("--num-speculative-tokens and --ngram-prompt-lookup-* need --speculative-model (a draft "
                         "model, or [ngram]); or use --speculative-config.")
    out: dict[str, Any] = {"num_speculative_tokens": k}
    if model in ("[ngram]", "ngram"):
        out["method"] = "ngram"
        if lookup_max is not None:
            out["prompt_lookup_max"] = lookup_max
        if lookup_min is not None:
            out["prompt_lookup_min"] = lookup_min
    else:
        out["model"] = model
    return out
