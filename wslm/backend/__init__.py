"""The wslm engine, with vLLM's public names: LLM, SamplingParams, RequestOutput.

Imports are lazy so that `import wslm.backend.sampling_params` (or the CLI) does not pull in torch."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

# OpenMP threads that spin while waiting make a CPU engine up to 10x slower whenever anything else runs on
# the machine (the GUI, a second server, a test client). Must be set before torch loads libgomp, so it is
# set when the engine package is first imported (which pulls in no torch), not for `import wslm`: the GUI
# and the Windows bridge leave the environment alone. Documented in wslm/envs.py.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from wslm.backend.config import EngineConfig
from wslm.backend.frontend.beam_search import BeamSearchOutput, BeamSearchParams, BeamSearchSequence
from wslm.backend.lora.request import LoRARequest
from wslm.backend.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from wslm.backend.sampling_params import SamplingParams
from wslm.backend.structured.params import GuidedDecodingParams, StructuredOutputsParams

if TYPE_CHECKING:
    from wslm.backend.entrypoints.llm import LLM
    from wslm.backend.frontend.llm_engine import LLMEngine

__all__ = [
    "LLM",
    "LLMEngine",
    "EngineConfig",
    "SamplingParams",
    "StructuredOutputsParams",
    "GuidedDecodingParams",
    "RequestOutput",
    "CompletionOutput",
    "Logprob",
    "RequestMetrics",
    "BeamSearchParams",
    "BeamSearchOutput",
    "BeamSearchSequence",
    "LoRARequest",
]


def __getattr__(name: str):
    if name == "LLM":
        from wslm.backend.entrypoints.llm import LLM

        return LLM
    if name == "LLMEngine":
        from wslm.backend.frontend.llm_engine import LLMEngine

        return LLMEngine
    raise AttributeError(name)
