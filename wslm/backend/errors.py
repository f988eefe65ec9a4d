"""The engine's typed errors, at the bottom of the layers so that every layer can raise or catch them.

A request's failure crosses to HTTP as an ErrorKind, never as a string to parse."""

from __future__ import annotations

import enum


class ErrorKind(str, enum.Enum):
    """Why a request failed inside the engine (the server maps each to a status code)."""

    OUT_OF_MEMORY = "out_of_memory"  # the step could not get memory; the server goes on (HTTP 507)
    ENGINE = "engine_error"  # the step raised; the server goes on (HTTP 500)
    ENGINE_DEAD = "engine_dead"  # the model's engine core (process) is gone; a pooled model reloads (HTTP 503)


class EngineDeadError(RuntimeError):
    """The model's workers are gone: no request can be served any more. The server reports it on /health
    and exits; LLM raises it."""


class WorkerStepError(RuntimeError):
    """Every rank raised the same way inside one step: that step's requests fail, the engine goes on."""


class RequestError(ValueError):
    """A request this engine cannot serve. A ValueError (what LLM.generate users catch) that also carries
    the OpenAI error fields, so that the server can answer 400 with them."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code
