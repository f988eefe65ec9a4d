"""What a chat sends when the conversation no longer fits the model's context window (LM Studio's
"context overflow policy"): drop the oldest messages, cut the middle out, or stop and say so.

No tokenizer here: tokens are estimated from UTF-8 bytes. The estimate is lenient (a token is ~4 bytes of
English, ~3 of code or CJK); after the server has refused a prompt as too long the chat switches to the
strict bound (a BPE token is at least one byte), which always fits."""

from __future__ import annotations

import re
from dataclasses import dataclass

from wslm.gui.content_parts import content_bytes, text_of, with_text

DROP_OLDEST, TRUNCATE_MIDDLE, STOP = "drop_oldest", "truncate_middle", "stop"
POLICIES = {
    DROP_OLDEST: "Drop the oldest messages",
    TRUNCATE_MIDDLE: "Cut out the middle",
    STOP: "Stop and ask",
}
DEFAULT_POLICY = DROP_OLDEST

LENIENT_BYTES_PER_TOKEN = 2.0  # under-counts only text denser than 2 bytes a token (rare)
TYPICAL_BYTES_PER_TOKEN = 3.5  # a likely count, for the context meter (English ~4, code and CJK ~3)
MESSAGE_OVERHEAD = 8  # the chat template's markers around each message
PROMPT_OVERHEAD = 32  # and around the whole prompt (generation prompt, BOS)
CUT_MARK = "\n\n[… {n} characters left out to fit the model's context …]\n\n"

_CONTEXT_LEN = re.compile(r"maximum context length is (\d+)")


@dataclass
class Fit:
    messages: list[dict] | None  # None: nothing is sent (policy "stop", or nothing can be made to fit)
    note: str = ""  # what was left out, for the reply's footer; or why nothing was sent


def context_from_error(message: str) -> int | None:
    """The context length an OpenAI-style server names in its "too long" error (vLLM's wording)."""
    m = _CONTEXT_LEN.search(message)
    return int(m.group(1)) if m else None


def estimate_tokens(messages: list[dict], bytes_per_token: float = LENIENT_BYTES_PER_TOKEN) -> int:
    return PROMPT_OVERHEAD + sum(_message_tokens(m, bytes_per_token) for m in messages)


def _message_tokens(message: dict, bytes_per_token: float) -> int:
    return int(content_bytes(message.get("content")) / bytes_per_token) + MESSAGE_OVERHEAD


def reply_reserve(context_len: int, max_tokens: int) -> int:
    """Room kept for the reply: its max tokens, but never more than a quarter of the context (a long
    conversation still gets a reply; the server then lets it run to the context's end)."""
    return max(16, min(max_tokens, context_len // 4))


def fit_messages(messages: list[dict], context_len: int | None, max_tokens: int, policy: str = DEFAULT_POLICY,
                 bytes_per_token: float = LENIENT_BYTES_PER_TOKEN) -> Fit:
    """`messages` (system first if any, the newest last) made to fit `context_len` tokens with room for
    the reply, as `policy` says. Unknown context: sent as they are."""
    if not context_len or not messages:
        return Fit(list(messages))
    budget = context_len - reply_reserve(context_len, max_tokens)
    if estimate_tokens(messages, bytes_per_token) <= budget:
        return Fit(list(messages))
    if policy == STOP:
        return Fit(None, f"The conversation is longer than the model's context ({context_len:,} tokens with room "
                         "for the reply). Delete some messages (Delete under each one), start a new chat, or choose "
                         "another “When the chat is too long” setting.")
    out = [dict(m) for m in messages]
    head = 1 if out[0].get("role") == "system" else 0
    if policy == TRUNCATE_MIDDLE:
        head += 1  # keep the first message (it usually sets the task) as well as the newest ones
    dropped = 0
    while estimate_tokens(out, bytes_per_token) > budget and len(out) - head > 1:
        del out[head]
        dropped += 1
        # Chat templates want user/assistant turns to alternate: no assistant turn right after the kept head.
        while len(out) - head > 1 and out[head].get("role") == "assistant" and (
                head == 0 or out[head - 1].get("role") != "user"):
            del out[head]
            dropped += 1
    cut = 0
    while estimate_tokens(out, bytes_per_token) > budget:
        over = estimate_tokens(out, bytes_per_token) - budget
        longest = max(range(len(out)), key=lambda i: len(text_of(out[i].get("content"))))
        text = text_of(out[longest].get("content"))
        new = cut_middle(text, len(text.encode()) - int((over + 16) * bytes_per_token) - len(CUT_MARK) - 16)
        if len(new) >= len(text):
            return Fit(None, f"Even the newest message does not fit the model's context ({context_len:,} tokens).")
        cut += len(text) - len(new)
        out[longest]["content"] = with_text(out[longest].get("content"), new)
    parts = []
    if dropped:
        parts.append(f"{dropped} earlier message{'s' if dropped != 1 else ''} left out")
    if cut:
        parts.append(f"{cut:,} characters cut from the middle")
    return Fit(out, " and ".join(parts) + " to fit the context" if parts else "")


def cut_middle(text: str, max_bytes: int) -> str:
    """`text` with its middle replaced by a marker, at most about `max_bytes` UTF-8 bytes long."""
    if max_bytes <= 0:
        return ""
    if len(text.encode()) <= max_bytes:
        return text
    ratio = len(text) / max(1, len(text.encode()))  # characters per byte of this text
    keep = max(0, int(max_bytes * ratio) // 2)
    out = text[:keep] + CUT_MARK.format(n=f"{len(text) - 2 * keep:,}") + text[len(text) - keep:]
    return out if len(out) < len(text) else text[: int(max_bytes * ratio)]  # too short to be worth a marker
