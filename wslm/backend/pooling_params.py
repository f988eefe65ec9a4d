"""PoolingParams: what an embedding request asks for (vLLM's name and fields)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class PoolingParams:
    dimensions: int | None = None  # Matryoshka models: keep the first N values (then renormalise)
    normalize: bool | None = None  # None: the model's default (on, as vLLM's embed task)

    def clone(self) -> PoolingParams:
        return PoolingParams(self.dimensions, self.normalize)
