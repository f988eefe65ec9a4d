"""Tensor parallelism: the process group (parallel_state), the executors that run one worker per rank
(mp: local processes, ray: actors on a Ray cluster) and the worker loop itself."""

from wslm.backend.distributed.parallel_state import (
    get_tp_rank,
    get_tp_size,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)

__all__ = [
    "get_tp_rank",
    "get_tp_size",
    "tensor_model_parallel_all_gather",
    "tensor_model_parallel_all_reduce",
]
