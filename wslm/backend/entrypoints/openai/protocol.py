"""Request bodies of the OpenAI API (plus vLLM's extra sampling fields), as pydantic models.

Unknown fields are ignored, as OpenAI and vLLM do; fields we know but cannot honour (tools, structured output,
logit_bias, ...) are declared here so that unsupported_fields() can refuse them with a clear 400 instead of
silently producing something else. Responses are plain dicts built in serving_*.py: the streaming hot path
builds one per token, and pydantic would only add cost there."""

from __future__ import annotations

import json
from typing import Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from wslm.backend.entrypoints.openai.errors import APIError, bad_request
from wslm.backend.entrypoints.openai.http_limits import load_json
from wslm.backend.entrypoints.openai.structured_request import structured_outputs_from_request
from wslm.backend.sampling_params import SamplingParams


class _Request(BaseModel):
    # strict: "stream": "yes" or "n": "2" is a 400, not a guess (JSON ints still fill float fields).
    model_config = ConfigDict(extra="ignore", protected_namespaces=(), strict=True)


class StreamOptions(_Request):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class ContentPart(_Request):
    type: str = "text"
    text: str | None = None
    # An image_url part's {"url": ..., "detail": ...} (the Responses API's input_image puts the URL string here);
    # frontend/images.py reads and checks it.
    image_url: Union[dict[str, Any], str, None] = None

    @model_validator(mode="after")
    def _text_needs_text(self) -> ContentPart:
        if self.type in ("text", "input_text") and self.text is None:
            raise ValueError(f"a content part of type {self.type!r} needs a `text` string")
        return self


# OpenAI's message roles ("function": its legacy tool results). Any other role is passed to the chat template as
# vLLM does (templates render `<|im_start|>{{ role }}` for whatever role they get); a template that refuses it
# answers a 400 naming the template's own message (frontend/chat.py).
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
_MAX_ROLE_LENGTH = 64


class ChatMessage(_Request):
    role: str
    content: Union[str, list[ContentPart], None] = None
    name: str | None = None
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None
    # Earlier reasoning sent back by the client: Qwen3's template keeps it for the turns of a tool loop.
    reasoning_content: str | None = None
    reasoning: str | None = None

    @field_validator("role")
    @classmethod
    def _role_text(cls, value: str) -> str:
        if not value or len(value) > _MAX_ROLE_LENGTH or not value.isprintable() or value != value.strip():
            raise ValueError(f"a message role must be a non-empty name of at most {_MAX_ROLE_LENGTH} printable "
                             f"characters without surrounding spaces, such as {', '.join(CHAT_ROLES[:4])}")
        return value


class FunctionDefinition(_Request):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(_Request):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class _SamplingFields(_Request):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    seed: int | None = None
    stop: Union[str, list[str], None] = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM's extra sampling parameters.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    # Token constraints and prompt extras (vLLM's).
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    prompt_logprobs: int | None = None
    # Logprobs of these ids at each generated position (with logprobs on), instead of the top ones.
    logprob_token_ids: list[int] | None = None
    truncate_prompt_tokens: int | None = None
    truncation_side: Literal["left", "right"] | None = None  # left (default): keep the last tokens
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool | None = None  # None: the server's --return-tokens-as-token-ids
    # Structured output (structured_request.py): OpenAI's response_format, vLLM's structured_outputs and
    # its older guided_* extras.
    response_format: dict[str, Any] | None = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    guided_whitespace_pattern: str | None = None
    guided_decoding_backend: str | None = None
    structured_outputs: Any = None
    # Beam search (serving_beam.py): n beams instead of n samples.
    use_beam_search: bool = False
    length_penalty: float | None = None
    _structured_source: str | None = PrivateAttr(default=None)

    @field_validator("n", mode="before")
    @classmethod
    def _null_n_is_one(cls, value: Any) -> Any:
        return 1 if value is None else value  # OpenAI's spec lets clients send "n": null

    def sampling_params(self, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        """SamplingParams for this request; a bad value becomes a 400 naming the field."""
        structured, self._structured_source = structured_outputs_from_request(self)
        try:
            return SamplingParams(
                n=self.n,
                temperature=1.0 if self.temperature is None else self.temperature,
                top_p=1.0 if self.top_p is None else self.top_p,
                top_k=self.top_k or 0,
                min_p=self.min_p or 0.0,
                presence_penalty=self.presence_penalty or 0.0,
                frequency_penalty=self.frequency_penalty or 0.0,
                repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
                seed=self.seed,
                stop=self.stop,
                stop_token_ids=self.stop_token_ids,
                include_stop_str_in_output=self.include_stop_str_in_output,
                ignore_eos=self.ignore_eos,
                max_tokens=max_tokens,
                min_tokens=self.min_tokens,
                logprobs=logprobs,
                skip_special_tokens=self.skip_special_tokens,
                spaces_between_special_tokens=self.spaces_between_special_tokens,
                logit_bias=self.logit_bias,
                allowed_token_ids=self.allowed_token_ids,
                bad_words=self.bad_words,
                prompt_logprobs=self.prompt_logprobs,
                logprob_token_ids=self.logprob_token_ids,
                truncate_prompt_tokens=self.truncate_prompt_tokens,
                truncation_side=self.truncation_side,
                structured_outputs=structured,
            )
        except (ValueError, TypeError) as exc:
            message = str(exc)
            field = message.split(" ", 1)[0]
            raise bad_request(message, param=field if field in type(self).model_fields else None) from exc

    def _common_unsupported(self) -> list[tuple[str, str]]:
        found = []
        if self.length_penalty not in (None, 1.0) and not self.use_beam_search:
            found.append(("length_penalty", "length_penalty applies to beam search: set use_beam_search too"))
        if self.guided_decoding_backend not in (None, "auto", "xgrammar"):
            found.append(("guided_decoding_backend", "wslm's structured output runs on xgrammar only"))
        return found

    @property
    def structured_source(self) -> str | None:
        """Which request field the structured-output constraint came from (set by sampling_params())."""
        return self._structured_source

    def check_stream_options(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise bad_request("Stream options can only be defined when `stream=True`.", param="stream_options")

    def check_logprob_token_ids(self, logprobs_on: bool) -> None:
        """vLLM's rules for logprob_token_ids: a non-empty list, and logprobs turned on."""
        if self.logprob_token_ids is None:
            return
        if not self.logprob_token_ids:
            raise bad_request("`logprob_token_ids` must not be an empty list.", param="logprob_token_ids")
        if not logprobs_on:
            raise bad_request("when using `logprob_token_ids`, `logprobs` must be set to true.",
                              param="logprob_token_ids")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    # vLLM's chat extras.
    chat_template: str | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    # Tool calling (serving_tools.py).
    tools: list[ChatTool] | None = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: bool | None = True
    # Known but not supported.
    functions: list[Any] | None = None
    function_call: Any = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None
    web_search_options: Any = None

    def unsupported_fields(self) -> list[tuple[str, str]]:
        found = self._common_unsupported()
        if self.functions or self.function_call not in (None, "none", "auto"):
            found.append(("functions", "the legacy `functions` / `function_call` fields are not supported; send "
                                       "`tools` and `tool_choice`"))
        if self.audio is not None or (self.modalities and set(self.modalities) - {"text"}):
            found.append(("modalities", "audio output is not supported: wslm serves text models"))
        if self.prediction is not None:
            found.append(("prediction", "predicted outputs are not supported"))
        if self.web_search_options is not None:
            found.append(("web_search_options", "web search is not supported"))
        return found

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def requested_logprobs(self) -> int | None:
        self.check_logprob_token_ids(bool(self.logprobs))
        if self.top_logprobs is not None:
            if not self.logprobs:
                raise bad_request("when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs")
            if self.top_logprobs < -1:  # the upper bound is the server's --max-logprobs; -1: the whole vocabulary
                raise bad_request(f"top_logprobs must be -1 (all) or more, got {self.top_logprobs}.",
                                  param="top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_SamplingFields):
    prompt: Union[str, list[str], list[int], list[list[int]], None] = None
    prompt_embeds: Any = None  # vLLM's; wslm takes text or token ids only
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None

    @field_validator("echo", mode="before")
    @classmethod
    def _null_echo_is_false(cls, value: Any) -> Any:
        return False if value is None else value  # nullable in OpenAI's spec
    suffix: str | None = None

    def unsupported_fields(self) -> list[tuple[str, str]]:
        found = self._common_unsupported()
        if self.suffix:
            found.append(("suffix", "suffix (fill-in-the-middle) is not supported"))
        if self.prompt_embeds not in (None, [], ""):
            found.append(("prompt_embeds", "prompt_embeds are not supported: send the prompt as text or token ids"))
        if self.best_of is not None and self.best_of != self.n:
            found.append(("best_of", "best_of other than n is not supported (as in vLLM's V1 engine)"))
        return found

    def prompts(self) -> list[str | list[int]]:
        """The prompt field as a list of prompts, each a string or token ids."""
        p = self.prompt
        if isinstance(p, str):
            items: list[str | list[int]] = [p]
        elif p and all(isinstance(x, int) for x in p):
            items = [list(p)]  # type: ignore[arg-type]
        else:
            items = list(p or [])  # type: ignore[arg-type]
        if not items:  # (an empty prompt inside the list is validation.validate_prompt's to refuse)
            raise bad_request("Either prompt or prompt_embeds must be provided and non-empty. Send `prompt` as "
                              "text, token ids, or a list of either.", param="prompt")
        return items


class TokenizeRequest(_Request):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatTool] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[int]


def parse_body(raw: bytes, model: type[_Request]) -> Any:
    """Parse a JSON body into a request model; every problem is a 400 in OpenAI's shape (never a 422)."""
    if not raw.strip():
        raise bad_request("The request body is empty: send a JSON object.")
    data = load_json(raw)
    if not isinstance(data, dict):
        raise bad_request(f"The request body must be a JSON object, got {type(data).__name__}.")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc) from None


def _validation_error(exc: ValidationError) -> APIError:
    errors = exc.errors(include_url=False)
    parts = []
    for err in errors[:5]:
        loc = ".".join(str(x) for x in err.get("loc", ()) if not _is_type_tag(x))
        parts.append(f"{loc or 'body'}: {err.get('msg')}" + (f" (got {_short(err['input'])})" if "input" in err else ""))
    first = errors[0] if errors else {}
    param = ".".join(str(x) for x in first.get("loc", ()) if not _is_type_tag(x)) or None
    return bad_request("Invalid request: " + "; ".join(parts), param=param)


def _is_type_tag(x: object) -> bool:
    # pydantic puts the tried union member into loc ("str", "list[int]"); it only confuses users.
    return isinstance(x, str) and (x in ("str", "int", "float", "bool", "none") or "[" in x or x.startswith("function"))


def _short(value: object) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."




class EmbeddingRequest(_Request):
    """POST /v1/embeddings (OpenAI's fields plus vLLM's `normalize`)."""

    model: str | None = None
    input: Union[str, list[str], list[int], list[list[int]]]
    encoding_format: str = "float"
    dimensions: int | None = None
    user: str | None = None
    normalize: bool | None = None
    truncate_prompt_tokens: int | None = None  # vLLM's: keep this many tokens of each input (-1: the context)

    def inputs(self) -> list[str | list[int]]:
        """The input field as a list of inputs, each a string or token ids (LangChain sends ids)."""
        x = self.input
        if isinstance(x, str):
            items: list[str | list[int]] = [x]
        elif x and all(isinstance(t, int) for t in x):
            items = [list(x)]  # type: ignore[arg-type]
        else:
            items = list(x)  # type: ignore[arg-type]
        if not items:
            raise bad_request("input must not be empty: send a string, a list of strings, or token ids.",
                              param="input")
        for i, item in enumerate(items):
            if len(item) == 0:
                raise bad_request(f"input[{i}] is empty: every input needs some text or tokens.", param="input")
        if self.encoding_format not in ("float", "base64"):
            raise bad_request(f"encoding_format must be float or base64, got {self.encoding_format!r}.",
                              param="encoding_format")
        return items


class ScoreRequest(_Request):
    """POST /score (vLLM's): text_1 against each text_2 (or pairwise when both are lists)."""

    model: str | None = None
    text_1: Union[str, list[str]]
    text_2: Union[str, list[str]]

    def pairs(self) -> list[tuple[str, str]]:
        a = [self.text_1] if isinstance(self.text_1, str) else list(self.text_1)
        b = [self.text_2] if isinstance(self.text_2, str) else list(self.text_2)
        if not a or not b:
            raise bad_request("text_1 and text_2 must not be empty.", param="text_1" if not a else "text_2")
        if len(a) == 1:
            return [(a[0], t) for t in b]
        if len(a) != len(b):
            raise bad_request(f"text_1 has {len(a)} texts and text_2 {len(b)}: give one text_1, or as many as "
                              "text_2 (scored pairwise).", param="text_2")
        return list(zip(a, b))


class RerankRequest(_Request):
    """POST /rerank, /v1/rerank, /v2/rerank (Jina/Cohere shape, as vLLM's)."""

    model: str | None = None
    query: str
    documents: list[str] = Field(min_length=1)
    top_n: int | None = None
    return_documents: bool = True
