"""The one place that checks a request against what this engine can serve (context length, vocabulary, n,
stop lists, the KV pool), with messages a user can act on. LLMEngine.add_request runs every check; the
server runs the same functions before queueing, to answer 400 with OpenAI's `param`/`code` at once."""

from __future__ import annotations

from dataclasses import dataclass

from wslm import defaults
from wslm.backend.errors import RequestError  # noqa: F401 - raised here, caught by importers
from wslm.backend.sampling_params import SamplingParams

# OpenAI's own cap on `n`; the server's --max-num-seqs may lower it further.
MAX_N = 128


@dataclass(slots=True)
class RequestLimits:
    """What a single request may ask for. Built by the engine from its config and pool; the server replaces
    the stop-list limits with its flags (--max-stop-strings, --max-stop-string-length)."""

    max_model_len: int
    vocab_size: int
    max_num_seqs: int = MAX_N
    num_kv_blocks: int | None = None  # the KV pool; None: not checked (a stand-in engine)
    block_size: int = defaults.BLOCK_SIZE
    max_stop_strings: int = 64
    max_stop_string_length: int = 512
    max_completions_per_request: int = 1024  # prompts x n of one /v1/completions request
    max_logprobs: int = 20  # --max-logprobs; -1: the whole vocabulary
    # Every layer windowed: the most blocks one sequence holds (the block manager frees those behind the window).
    window_blocks: int | None = None

    @property
    def max_n(self) -> int:
        return min(MAX_N, self.max_num_seqs)


def check_token_ids(ids: list[int], vocab_size: int, param: str = "prompt") -> None:
    """Every bad id is named (the first ten), not just the first: a client fixes its list in one go."""
    not_ints = [t for t in ids if isinstance(t, bool) or not isinstance(t, int)]
    if not_ints:
        raise RequestError(f"Token ids must be integers, got {_some(not_ints)}.", param=param)
    outside = [t for t in ids if not 0 <= t < vocab_size]
    if outside:
        raise RequestError(
            f"Token id{'s' if len(outside) > 1 else ''} {_some(outside)} {'are' if len(outside) > 1 else 'is'} out "
            f"of vocabulary (out of range): this model's vocabulary has {vocab_size} tokens (ids 0..{vocab_size - 1}).",
            param=param,
        )


def _some(values: list) -> str:
    shown = ", ".join(repr(v) for v in values[:10])
    return shown + (f" and {len(values) - 10} more" if len(values) > 10 else "")


def check_length(prompt_len: int, max_tokens: int | None, max_model_len: int, what: str = "prompt") -> None:
    """vLLM's context-overflow messages, with the token counts."""
    if prompt_len >= max_model_len:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{prompt_len} input tokens. Please reduce the length of the input {what} (or start the server with "
            "a larger --max-model-len).",
            param=what,
            code="context_length_exceeded",
        )
    if max_tokens is not None and prompt_len + max_tokens > max_model_len:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_len + max_tokens} tokens ({prompt_len} in the {what}, {max_tokens} in the completion). "
            f"Please reduce the length of the {what} or completion (max_tokens at most {max_model_len - prompt_len}).",
            param="max_tokens",
            code="context_length_exceeded",
        )


def check_sampling(params: SamplingParams, limits: RequestLimits) -> None:
    """Limits on what one request may ask of the engine: n and the stop list."""
    if params.n > limits.max_n:
        why = "OpenAI's limit" if limits.max_n == MAX_N else "the server's --max-num-seqs"
        raise RequestError(
            f"n must be at most {limits.max_n} ({why}), got {params.n}. Ask for fewer "
            "completions, or send several requests.",
            param="n",
        )
    if params.seed is not None and not -(2**63) <= params.seed < 2**63 - MAX_N:
        raise RequestError(f"seed must be a 64-bit integer, got {params.seed}.", param="seed")
    if params.top_k > 2**31 or (params.max_tokens or 0) > 2**31 or params.min_tokens > 2**31:
        raise RequestError("top_k, max_tokens and min_tokens must be below 2**31.", param="top_k")
    if params.logprobs is not None and 0 <= limits.max_logprobs and (
        params.logprobs == -1 or limits.max_logprobs < params.logprobs
    ):
        raise RequestError(
            f"{params.logprobs} top logprobs were asked for; this server allows at most {limits.max_logprobs} "
            "(its --max-logprobs flag).",
            param="logprobs",
        )
    plp = params.prompt_logprobs
    if plp is not None and limits.max_logprobs != -1 and (plp == -1 or plp > limits.max_logprobs):
        raise RequestError(
            f"prompt_logprobs={plp} asks for more than this server allows ({limits.max_logprobs}, its "
            "--max-logprobs flag; -1, the whole vocabulary, needs --max-logprobs -1).",
            param="prompt_logprobs",
        )
    stops = params.stop or []
    if len(stops) > limits.max_stop_strings:
        raise RequestError(
            f"stop has {len(stops)} strings; at most {limits.max_stop_strings} are allowed "
            "(the server's --max-stop-strings).",
            param="stop",
        )
    longest = max((len(s) for s in stops), default=0)
    if longest > limits.max_stop_string_length:
        raise RequestError(
            f"A stop string is {longest} characters long; at most {limits.max_stop_string_length} "
            "are allowed (the server's --max-stop-string-length).",
            param="stop",
        )
    if len(params.stop_token_ids or []) > limits.vocab_size:
        raise RequestError("stop_token_ids lists more ids than the vocabulary has.", param="stop_token_ids")
    check_token_ids(params.stop_token_ids or [], limits.vocab_size, "stop_token_ids")
    check_token_ids(list(params.logit_bias or {}), limits.vocab_size, "logit_bias")
    check_token_ids(params.allowed_token_ids or [], limits.vocab_size, "allowed_token_ids")
    wanted = params.logprob_token_ids or []
    check_token_ids(wanted, limits.vocab_size, "logprob_token_ids")
    if limits.max_logprobs != -1 and len(wanted) > limits.max_logprobs:
        raise RequestError(
            f"logprob_token_ids lists {len(wanted)} ids; this server reports at most {limits.max_logprobs} per "
            "position (its --max-logprobs flag; -1 lifts the limit).",
            param="logprob_token_ids",
        )


def check_batch(num_prompts: int, n: int, limits: RequestLimits) -> None:
    """A list of prompts is one engine request per prompt: all of them queue at once, ahead of every later
    client, so one HTTP request may start at most max_completions_per_request completions in total."""
    if num_prompts * n > limits.max_completions_per_request:
        raise RequestError(
            f"This request asks for {num_prompts} prompts x n={n} = {num_prompts * n} completions; at most "
            f"{limits.max_completions_per_request} are allowed in one request. Split it into several requests.",
            param="prompt",
        )


def check_fits_pool(prompt_len: int, params: SamplingParams, limits: RequestLimits) -> None:
    """Refuse at once a request whose n completions can never be in the KV pool together: queued, it would
    stall the engine (preempting and recomputing forever) instead of failing. Completions share the prompt's
    full blocks; each needs its own blocks for the rest. With no max_tokens, each needs room for one token."""
    if limits.num_kv_blocks is None:
        return
    bs = limits.block_size
    shared = prompt_len // bs
    new_tokens = params.max_tokens if params.max_tokens is not None else 1
    own = -(-(prompt_len + new_tokens) // bs) - shared
    needed = shared + params.n * own
    if limits.window_blocks is not None:
        needed = min(needed, params.n * limits.window_blocks)
    if needed > limits.num_kv_blocks:
        pool = limits.num_kv_blocks * bs
        raise RequestError(
            f"This request can never fit the KV cache: {params.n} completion(s) of up to {new_tokens} tokens after "
            f"a {prompt_len}-token prompt need {needed * bs} tokens of cache, and this server's holds {pool}. "
            "Lower n or max_tokens, or start the server with more KV cache (--kv-cache-memory on CPU, "
            "--gpu-memory-utilization on GPU).",
            param="n" if params.n > 1 else "max_tokens",
            code="kv_cache_exceeded",
        )


def check_request(
    prompt_ids: list[int], params: SamplingParams, limits: RequestLimits, what: str = "prompt"
) -> None:
    """Every check on an already-tokenized request (max_tokens None means "up to the context length")."""
    check_sampling(params, limits)
    check_length(len(prompt_ids), params.max_tokens, limits.max_model_len, what)
    check_fits_pool(len(prompt_ids), params, limits)


def validate_prompt(
    prompt, params: SamplingParams, tokenizer, limits: RequestLimits, what: str = "prompt"
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
            raise RequestError("A prompt dict needs 'prompt' (text) or 'prompt_token_ids' (a list of ints).")
    elif isinstance(prompt, str):
        text, ids = prompt, None
    elif isinstance(prompt, (list, tuple)):
        ids = prompt
    else:
        raise RequestError(
            f"A prompt must be text, a list of token ids or a dict, not {type(prompt).__name__}."
        )
    if ids is None:
        if not isinstance(text, str):
            raise RequestError("The prompt text must be a string.")
        if not text:
            raise RequestError("The prompt is empty: send at least one token of text.", param="prompt")
        ids = tokenizer.encode(text)
    ids = list(ids)
    if not ids:
        raise RequestError("The prompt is empty: send at least one token.", param="prompt")
    check_token_ids(ids, limits.vocab_size, what)
    check_request(ids, params, limits, what)
    if params.max_tokens is None:
        params.max_tokens = limits.max_model_len - len(ids)
        if params.min_tokens > params.max_tokens:
            raise RequestError(
                f"min_tokens ({params.min_tokens}) is more than the context leaves for the "
                f"completion ({params.max_tokens} tokens).",
                param="min_tokens",
            )
    return text, ids
