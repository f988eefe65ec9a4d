"""Faults on cue, for tests of the recovery paths (out of memory, a dead engine) on a real engine and server.

Off unless WSLM_FAULT_INJECTION holds a JSON object (or a test sets LLMEngine.faults):
  {"oom_above_tokens": N}   every step that computes more than N tokens raises out-of-memory, as a real
                            allocation would (torch.OutOfMemoryError on CUDA, MemoryError on CPU)
  {"die_after_steps": N}    the N-th step raises EngineDeadError, as when the model's workers are gone
  {"load_delay_s": N}       loading the model takes N seconds longer (a big model, for stop-while-loading)
Never set it in production: it exists so that these paths are exercised rather than assumed."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

ENV = "WSLM_FAULT_INJECTION"


@dataclass(slots=True)
class Faults:
    oom_above_tokens: int | None = None
    die_after_steps: int | None = None
    load_delay_s: int | None = None
    steps: int = 0

    @classmethod
    def from_env(cls) -> Faults | None:
        raw = os.environ.get(ENV, "").strip()
        if not raw:
            return None
        try:
            values = json.loads(raw)
            return cls(**{k: int(v) for k, v in values.items()})
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{ENV} must be a JSON object like {{\"oom_above_tokens\": 64}}, got {raw!r}.") from exc

    def before_load(self) -> None:
        if self.load_delay_s:
            import time

            time.sleep(self.load_delay_s)

    def before_step(self, num_tokens: int) -> None:
        """Called by LLMEngine.step with the step's token count, just before the model runs."""
        self.steps += 1
        if self.die_after_steps is not None and self.steps >= self.die_after_steps:
            from wslm.backend.errors import EngineDeadError

            raise EngineDeadError(f"injected fault: the engine died at step {self.steps} ({ENV})")
        if self.oom_above_tokens is not None and num_tokens > self.oom_above_tokens:
            raise MemoryError(f"injected fault: out of memory for a {num_tokens}-token step ({ENV})")
