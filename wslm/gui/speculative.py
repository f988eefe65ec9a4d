"""Speculative decoding in the app (no Qt): the `--speculative-config` the Server panel passes to
`wslm serve`, and the acceptance rate read from the server's Prometheus counters (as vLLM exports them).

Prompt lookup (n-gram) drafts from the prompt itself, no second model; a draft model must share the main
model's tokenizer (a smaller sibling of the same family)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

NUM_SPECULATIVE_TOKENS = 4  # tokens drafted per step (vLLM's num_speculative_tokens)
PROMPT_LOOKUP_MAX = 4  # the longest n-gram looked up in the prompt
DRAFT_COUNTER = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_COUNTER = "vllm:spec_decode_num_accepted_tokens_total"


def speculative_config(draft_model: str = "", num_tokens: int = NUM_SPECULATIVE_TOKENS,
                       lookup_max: int = PROMPT_LOOKUP_MAX) -> str:
    """The JSON for --speculative-config: prompt lookup when `draft_model` is "", else that draft model
    (a path or an installed model's id)."""
    if draft_model:
        return json.dumps({"model": draft_model, "num_speculative_tokens": int(num_tokens)})
    return json.dumps({"method": "ngram", "num_speculative_tokens": int(num_tokens),
                       "prompt_lookup_max": int(lookup_max)})


# A Prometheus sample line: name, optional {labels}, value (timestamps are not used by vLLM's exporter).
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


@dataclass(frozen=True)
class SpecCounts:
    """Draft tokens proposed and accepted (since the server started, or between two readings)."""

    draft: float
    accepted: float

    @property
    def rate(self) -> float | None:
        return self.accepted / self.draft if self.draft > 0 else None

    def __sub__(self, before: SpecCounts) -> SpecCounts:
        if self.draft < before.draft or self.accepted < before.accepted:
            return self  # the server restarted between the readings: its counters began again
        return SpecCounts(self.draft - before.draft, self.accepted - before.accepted)

    def text(self) -> str:
        rate = self.rate
        return (f"{int(self.accepted):,}/{int(self.draft):,} draft tokens accepted"
                + (f" ({rate:.0%})" if rate is not None else ""))


def spec_counts(metrics_text: str) -> SpecCounts | None:
    """The acceptance counters in a /metrics text (summed over their labels, e.g. per model), None when the
    server has none (speculative decoding off, or not a server that exports them)."""
    sums: dict[str, float] = {}
    for line in metrics_text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) in (DRAFT_COUNTER, ACCEPTED_COUNTER):
            try:
                sums[m.group(1)] = sums.get(m.group(1), 0.0) + float(m.group(3))
            except ValueError:
                continue
    if DRAFT_COUNTER not in sums:
        return None
    return SpecCounts(sums[DRAFT_COUNTER], sums.get(ACCEPTED_COUNTER, 0.0))


def acceptance_text(last: SpecCounts | None, total: SpecCounts | None, available: bool | None) -> str:
    """The developer view's line; "" while nothing is known yet."""
    if available is None:
        return ""
    if not available:
        return "Speculative decoding: off (the server reports no draft tokens)."
    parts = []
    if last is not None:
        parts.append(f"last request {last.text()}")
    if total is not None:
        parts.append(f"overall {total.text()}")
    return "Speculative decoding: " + ("; ".join(parts) or "no request measured yet") + "."
