"""vLLM's per-request timing metrics (`--enable-per-request-metrics`): a `metrics` object on chat, completion
and Responses answers (on the final usage chunk of a stream), for requests that map to one generation stream.

Token times have output-batch resolution, as vLLM's: the front end sees tokens when a step's outputs arrive, so
tokens of one batch share a timestamp. The engine's own times (arrival, first scheduled) come with each
RequestOutput; all times are time.monotonic()."""

from __future__ import annotations

import time
from typing import Any


class RequestTiming:
    """Collects the times of one request's outputs (fed by Tracker.fold)."""

    def __init__(self) -> None:
        self.arrival: float | None = None
        self.scheduled: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.tokens = 0

    def observe(self, item: Any, new_tokens: int) -> None:
        now = time.monotonic()
        engine = getattr(item, "metrics", None)
        if engine is not None:
            self.arrival = self.arrival or getattr(engine, "arrival_time", None)
            self.scheduled = self.scheduled or getattr(engine, "first_scheduled_time", None)
        if new_tokens:
            if self.first_token is None:
                self.first_token = now
            self.last_token = now
            self.tokens += new_tokens

    def as_json(self) -> dict:
        """vLLM's fields, in milliseconds; null where a time is unknown (or, for mean_itl_ms, one token)."""

        def ms(a: float | None, b: float | None) -> float | None:
            return round((b - a) * 1000.0, 3) if a is not None and b is not None else None

        start = self.scheduled if self.scheduled is not None else self.arrival
        decode = ms(self.first_token, self.last_token)
        itl = round(decode / (self.tokens - 1), 3) if decode is not None and self.tokens > 1 else None
        whole = (self.last_token - start) if start is not None and self.last_token is not None else None
        return {
            "time_to_first_token_ms": ms(start, self.first_token),
            "generation_time_ms": decode,
            "queue_time_ms": ms(self.arrival, self.scheduled),
            "mean_itl_ms": itl,
            "tokens_per_second": round(self.tokens / whole, 3) if whole else None,
        }
