"""RayExecutor: one Ray actor per rank, for ranks on several machines joined into a Ray cluster that the
user starts (`ray start --head` on one, `ray start --address HEAD:6379` on the others). The ranks still talk
through torch.distributed (NCCL or gloo); Ray only places them and carries the per-step calls."""

from __future__ import annotations

import logging
import time

from wslm.backend.errors import EngineDeadError, WorkerStepError
from wslm.backend.executor.abstract import TPExecutorBase

logger = logging.getLogger("wslm.executor")

_ERROR_GRACE_S = 10.0


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ValueError(
            'distributed_executor_backend="ray" needs Ray, which is not installed. Install it with '
            '`pip install "wslm[ray]"`, or use --distributed-executor-backend mp on one machine.'
        ) from None
    return ray


class RayExecutor(TPExecutorBase):
    def __init__(self, config, source, model_config) -> None:
        ray = _import_ray()
        self.ray = ray
        self.size = config.tensor_parallel_size
        self.block_size = config.block_size
        self.dead: str | None = None
        self.actors: list = []
        self._started_ray = False
        if not ray.is_initialized():
            try:
                ray.init(address="auto", log_to_driver=False)  # a cluster the user started
            except ConnectionError:
                logger.info("No running Ray cluster found: starting a local one")
                ray.init(log_to_driver=False)
                self._started_ray = True
        use_gpu = _wants_gpu(config)
        resources = ray.cluster_resources()
        need, have = ("GPU", resources.get("GPU", 0)) if use_gpu else ("CPU", resources.get("CPU", 0))
        if have < self.size:
            raise ValueError(
                f"tensor_parallel_size={self.size} needs {self.size} {need}s in the Ray cluster, which has "
                f"{int(have)}. Join more machines with `ray start --address HEAD:6379`, or lower "
                "--tensor-parallel-size."
            )
        from wslm.backend.worker.worker import Worker

        remote = ray.remote(num_gpus=1, num_cpus=0)(Worker) if use_gpu else ray.remote(num_cpus=1)(Worker)
        self.actors = [
            remote.options(name=None).remote(config, source, model_config, rank, self.size, None)
            for rank in range(self.size)
        ]
        try:
            host, port = ray.get(self.actors[0].node_address.remote())
            self.init_method = f"tcp://{host}:{port}"
            device = "cuda" if use_gpu else "cpu"
            self._start([(device, self.init_method)] * self.size, config, model_config)
        except BaseException:
            self.shutdown()
            raise
        logger.info("Tensor parallel: %d Ray actors (pids %s), group at %s", self.size, self.pids, self.init_method)

    def _call_all(self, method: str, *args) -> list:
        return self._call_some(list(range(self.size)), method, *args)

    def _call_each(self, method: str, per_rank_args: list[tuple]) -> list:
        return self._gather(list(range(self.size)), [getattr(self.actors[r], method).remote(*a)
                                                      for r, a in enumerate(per_rank_args)])  # fmt: skip

    def _call_some(self, ranks: list[int], method: str, *args) -> list:
        return self._gather(ranks, [getattr(self.actors[r], method).remote(*args) for r in ranks])

    def _gather(self, ranks: list[int], refs: list) -> list:
        ray = self.ray
        if self.dead:
            raise EngineDeadError(self.dead)
        results: dict[int, object] = {}
        errors: dict[int, str] = {}
        first_error_at = None
        for rank, ref in zip(ranks, refs):
            timeout = None if first_error_at is None else max(0.1, first_error_at + _ERROR_GRACE_S - time.monotonic())
            try:
                results[rank] = ray.get(ref, timeout=timeout)
            except ray.exceptions.GetTimeoutError:
                self._die(rank, "it hung after another rank raised")
            except ray.exceptions.RayActorError as exc:
                self._die(rank, f"the actor died ({str(exc).splitlines()[0]})")
            except ray.exceptions.RayTaskError as exc:
                cause = exc.cause if getattr(exc, "cause", None) is not None else exc
                errors[rank] = f"{type(cause).__name__}: {cause}"
                first_error_at = first_error_at or time.monotonic()
        if errors:
            rank, short = min(errors.items())
            if len(errors) < len(ranks):
                self._die(rank, f"it raised {short} while the others did not")
            raise WorkerStepError(f"{short} (on all {len(ranks)} tensor-parallel ranks)")
        return [results[r] for r in ranks]

    def _die(self, rank: int, why: str) -> None:
        self.dead = (
            f"Tensor-parallel worker rank {rank} (Ray actor) failed: {why}. The engine stopped all {self.size} "
            "workers; restart it."
        )
        logger.error(self.dead)
        self.shutdown()
        raise EngineDeadError(self.dead)

    def check_health(self) -> None:
        if self.dead:
            raise EngineDeadError(self.dead)

    def shutdown(self) -> None:
        actors, self.actors = self.actors, []
        for actor in actors:
            try:
                self.ray.kill(actor)
            except Exception:  # noqa: BLE001
                pass
        if self._started_ray and self.ray.is_initialized():
            self.ray.shutdown()
            self._started_ray = False


def _wants_gpu(config) -> bool:
    if config.device.startswith("cuda"):
        return True
    if config.device == "cpu":
        return False
    import torch

    return torch.cuda.is_available()
