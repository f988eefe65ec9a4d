"""vLLM's response extras, shared by chat and completions: prompt_logprobs, echo with logprobs,
and return_token_ids."""

from __future__ import annotations

from typing import Any

from wslm.backend.entrypoints.openai.serving_base import _lp, completion_logprobs, token_text


def prompt_logprobs_json(tokenizer: Any, plps: list | None, as_ids: bool = False) -> list | None:
    """vLLM's `prompt_logprobs`: null for the first token, then {token id: {logprob, rank, decoded_token}}."""
    if plps is None:
        return None
    return [
        None if entry is None else {
            str(tid): {"logprob": _lp(e.logprob), "rank": e.rank, "decoded_token": token_text(tokenizer, tid, e, as_ids)}
            for tid, e in entry.items()
        }
        for entry in plps
    ]


def echo_logprobs(tokenizer: Any, prompt_ids: list[int], plps: list | None, top_n: int, as_ids: bool = False) -> dict:
    """The completions `logprobs` object for an echoed prompt (the first token has none, as in OpenAI's)."""
    entries = list(plps or [None] * len(prompt_ids))
    first = token_text(tokenizer, prompt_ids[0], None, as_ids)
    rest = completion_logprobs(tokenizer, prompt_ids[1:], entries[1:], top_n, len(first), as_ids)
    return {
        "text_offset": [0, *rest["text_offset"]],
        "token_logprobs": [None, *rest["token_logprobs"]],
        "tokens": [first, *rest["tokens"]],
        "top_logprobs": [None, *rest["top_logprobs"]],
    }


def join_logprobs(head: dict, tail: dict | None) -> dict:
    if tail is None:
        return head
    return {key: head[key] + tail[key] for key in head}


def chat_response_extras(body: dict, req: Any, tracker: Any, prompt_ids: list[int], tokenizer: Any,
                         token_ids: list[list[int]]) -> dict:
    """vLLM's chat extras on a whole response: prompt_logprobs and prompt_token_ids at the top level,
    token_ids per choice."""
    if req.prompt_logprobs is not None:
        body["prompt_logprobs"] = prompt_logprobs_json(tokenizer, tracker.prompt_logprobs[0],
                                                       req.return_tokens_as_token_ids)
    if req.return_token_ids:
        body["prompt_token_ids"] = prompt_ids
        for choice, ids in zip(body["choices"], token_ids, strict=True):
            choice["token_ids"] = list(ids)
    return body


class ChatStreamExtras:
    """The same extras on a chat stream: token_ids on each content chunk, prompt_token_ids at the top of the
    stream's first chunk only (vLLM's shape), prompt_logprobs on the first content chunk (the engine reports
    them with the first token)."""

    def __init__(self, req: Any, tracker: Any, prompt_ids: list[int], tokenizer: Any) -> None:
        self.req, self.tracker, self.prompt_ids, self.tokenizer = req, tracker, prompt_ids, tokenizer
        self.sent_prompt_logprobs = req.prompt_logprobs is None

    def first_chunk_fields(self) -> dict | None:
        return {"prompt_token_ids": self.prompt_ids} if self.req.return_token_ids else None

    def content_chunk(self, choice: dict, token_ids: list[int]) -> dict:
        if self.req.return_token_ids:
            choice["token_ids"] = list(token_ids)
        if not self.sent_prompt_logprobs and self.tracker.prompt_logprobs[0] is not None:
            choice["prompt_logprobs"] = prompt_logprobs_json(self.tokenizer, self.tracker.prompt_logprobs[0],
                                                             self.req.return_tokens_as_token_ids)
            self.sent_prompt_logprobs = True
        return choice
