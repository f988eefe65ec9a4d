"""Faults on cue, for tests of the recovery paths (out of memory, a dead engine, a slow load) on a real
engine and server: an executor that wraps the real one-device executor.

In a test process: `LLMEngine(EngineConfig(..., distributed_executor_backend=BACKEND))`, then set
`engine.executor.faults = Faults(...)`. For a `wslm serve` subprocess: put tests/ on PYTHONPATH, pass
`--distributed-executor-backend fault_executor:FaultyExecutor` and the faults as JSON in WSLM_TEST_FAULTS:
  {"oom_above_tokens": N}   every step that computes more than N tokens raises out-of-memory, as a real
                            allocation would (torch.OutOfMemoryError on CUDA, MemoryError on CPU)
  {"die_after_steps": N}    the N-th step raises EngineDeadError, as when the model's workers are gone
  {"load_delay_s": N}       loading the model takes N seconds longer (a big model, for stop-while-loading)"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from wslm.backend.errors import EngineDeadError
from wslm.backend.executor.uniproc import UniProcExecutor

ENV = "WSLM_TEST_FAULTS"
BACKEND = "fault_executor:FaultyExecutor"
TESTS_DIR = str(Path(__file__).resolve().parent)


def server_env(faults: dict) -> dict[str, str]:
    """The environment a `wslm serve` subprocess needs to load this executor with these faults."""
    path = os.pathsep.join(p for p in (TESTS_DIR, os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, ENV: json.dumps(faults)}


@dataclass(slots=True)
class Faults:
    oom_above_tokens: int | None = None
    die_after_steps: int | None = None
    load_delay_s: int | None = None
    steps: int = 0

    @classmethod
    def from_env(cls) -> Faults | None:
        raw = os.environ.get(ENV, "").strip()
        return cls(**{k: int(v) for k, v in json.loads(raw).items()}) if raw else None

    def before_step(self, num_tokens: int) -> None:
        self.steps += 1
        if self.die_after_steps is not None and self.steps >= self.die_after_steps:
            raise EngineDeadError(f"injected fault: the engine died at step {self.steps} ({ENV})")
        if self.oom_above_tokens is not None and num_tokens > self.oom_above_tokens:
            raise MemoryError(f"injected fault: out of memory for a {num_tokens}-token step ({ENV})")


class FaultyExecutor(UniProcExecutor):
    def __init__(self, config, source, model_config, device, embedding: bool = False) -> None:
        self.faults = Faults.from_env()
        if self.faults is not None and self.faults.load_delay_s:
            time.sleep(self.faults.load_delay_s)
        super().__init__(config, source, model_config, device, embedding)

    def execute(self, so):
        if self.faults is not None:
            self.faults.before_step(so.num_tokens)  # before anything is computed, as a real allocation fails
        return super().execute(so)
