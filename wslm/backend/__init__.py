"""The wslm engine, with vLLM's public names: LLM, SamplingParams, RequestOutput.

Imports are lazy so that `import wslm.backend.sampling_params` (or the CLI) does not pull in torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from wslm.backend.config import EngineConfig
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
]


def __getattr__(name: str):
    if name == "LLM":
        from wslm.backend.entrypoints.llm import LLM

        return LLM
    if name == "LLMEngine":
        from wslm.backend.frontend.llm_engine import LLMEngine

        return LLMEngine
    raise AttributeError(name)
