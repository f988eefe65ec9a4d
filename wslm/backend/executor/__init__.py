"""Executors run the model's workers: one in this process (uniproc) or one per tensor-parallel rank (mp:
local processes, ray: actors on a Ray cluster). The engine core calls only the interface in abstract.py.

--distributed-executor-backend picks one: "uni" (one device; the default at --tensor-parallel-size 1),
"mp" (the default above 1), "ray", or "package.module:Class" for an Executor of your own (as vLLM takes an
executor class), built with (config, source, model_config, device, embedding)."""

from __future__ import annotations

import importlib

BACKENDS = ("uni", "mp", "ray")


def make_executor(config, source, model_config, device, embedding: bool = False):
    backend = config.distributed_executor_backend or ("mp" if config.tensor_parallel_size > 1 else "uni")
    if ":" in backend:
        module, _, name = backend.partition(":")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"--distributed-executor-backend {backend}: cannot load {name} from {module} ({exc}). "
                             "Give 'uni', 'mp', 'ray' or an importable 'package.module:Class'.") from exc
        return cls(config, source, model_config, device, embedding)
    if backend == "uni":
        if config.tensor_parallel_size > 1:
            raise ValueError("--distributed-executor-backend uni runs one device: use mp or ray with "
                             "--tensor-parallel-size above 1.")
        from wslm.backend.executor.uniproc import UniProcExecutor

        return UniProcExecutor(config, source, model_config, device, embedding)
    if config.tensor_parallel_size == 1:
        # mp / ray asked for with one rank: one device needs no workers (as before this flag had "uni").
        from wslm.backend.executor.uniproc import UniProcExecutor

        return UniProcExecutor(config, source, model_config, device, embedding)
    from wslm.backend.distributed.parallel_state import check_divisible
    from wslm.backend.quant.shard import checkpoint_group_size

    # Before any worker starts: a size that does not split the heads (or a checkpoint's groups) fails here.
    check_divisible(model_config, config.tensor_parallel_size, checkpoint_group_size(source, model_config.quantization))
    if backend == "ray":
        from wslm.backend.executor.ray_executor import RayExecutor

        return RayExecutor(config, source, model_config)
    from wslm.backend.executor.mp_executor import MultiprocExecutor

    return MultiprocExecutor(config, source, model_config)
