"""Executors run the model's workers: one in this process (uniproc) or one per tensor-parallel rank (mp:
local processes, ray: actors on a Ray cluster). The engine core calls only the interface in abstract.py."""

from __future__ import annotations


def make_executor(config, source, model_config) :
    backend = config.distributed_executor_backend or "mp"
    if backend == "ray":
        from wslm.backend.executor.ray_executor import RayExecutor

        return RayExecutor(config, source, model_config)
    from wslm.backend.executor.mp_executor import MultiprocExecutor

    return MultiprocExecutor(config, source, model_config)
