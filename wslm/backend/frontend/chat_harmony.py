"""Chat history as gpt-oss's harmony chat template reads it. That template renders one tool call per assistant
message (`<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>ARGS<|call|>`), names each
`tool` message after the latest call, and takes earlier reasoning from a `thinking` field (raising when both
`content` and `thinking` come with a call). OpenAI clients send parallel calls in one message, their results
after it, and reasoning back as `reasoning_content` (or `reasoning`): this reshapes that history so that every
call and result is rendered, each result under its own call's name (as the model wrote them: one call, its
result, the next call)."""

from __future__ import annotations

HARMONY_MARK = "<|channel|>"  # a chat template that writes harmony's channels


def harmony_messages(messages: list[dict]) -> list[dict]:
    """messages (normalized) reshaped for a harmony template; the input is left unchanged."""
    out: list[dict] = []
    i = 0
    while i < len(messages):
        msg = dict(messages[i])
        i += 1
        if msg.get("role") != "assistant":
            out.append(msg)
            continue
        thinking = msg.pop("reasoning_content", None) or msg.pop("reasoning", None)
        msg.pop("reasoning", None)
        if thinking and "thinking" not in msg:
            msg["thinking"] = thinking
        calls = msg.get("tool_calls") or []
        if not calls:
            msg.pop("tool_calls", None)  # the template takes any `tool_calls` key, even an empty list, for a call
        if calls and msg.get("content") and msg.get("thinking"):
            # The template takes one analysis text per call message: keep both, reasoning first.
            msg["thinking"] = f"{msg['thinking']}\n\n{msg.pop('content')}"
            msg["content"] = ""
        if len(calls) <= 1:
            out.append(msg)
            continue
        # The results that answer this message's calls (the run of tool messages after it), by call id.
        results: list[dict] = []
        while i < len(messages) and messages[i].get("role") == "tool":
            results.append(messages[i])
            i += 1
        for n, call in enumerate(calls):
            part = dict(msg, tool_calls=[call]) if n == 0 else {"role": "assistant", "content": "",
                                                                "tool_calls": [call]}
            out.append(part)
            for r in [r for r in results if r.get("tool_call_id") == call.get("id")]:
                out.append(r)
                results.remove(r)
        out.extend(results)  # results naming no call of this message keep their place after it
    return out
