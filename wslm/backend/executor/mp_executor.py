"""MultiprocExecutor: one spawned process per rank on this machine, talking over pipes.

Every call goes to the ranks at once and waits for all answers while also watching the processes: a rank
that dies is noticed at once (not after a collective's time-out), and then every other rank is stopped so
nothing is left holding a GPU or a port."""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing as mp
import sys
import time
import weakref
from multiprocessing.connection import wait

from wslm.backend.distributed.net import free_port
from wslm.backend.errors import EngineDeadError, WorkerStepError
from wslm.backend.executor.abstract import TPExecutorBase
from wslm.backend.worker.worker import worker_main

logger = logging.getLogger("wslm.executor")

# After one rank raises, how long the others get to raise too (the same error on every rank means a bad
# step, not a broken group). A rank still busy after that is stuck in a collective: the group is lost.
_ERROR_GRACE_S = 10.0


class MultiprocExecutor(TPExecutorBase):
    def __init__(self, config, source, model_config) -> None:
        self.size = config.tensor_parallel_size
        self.block_size = config.block_size
        self.dead: str | None = None
        self.procs: list = []
        self.conns: list = []
        ctx = mp.get_context("spawn")  # fork would copy the engine's threads and CUDA state
        init_method = f"tcp://127.0.0.1:{free_port()}"
        for rank in range(self.size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=worker_main, name=f"wslm-tp-rank{rank}", daemon=True,
                args=(child, config, source, model_config, rank, self.size, init_method),
            )  # fmt: skip
            with _main_module_hidden():
                proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)
        finalizer = weakref.finalize(self, _stop_all, list(self.procs), list(self.conns))
        atexit.register(finalizer)
        self._finalizer = finalizer
        try:
            self._start([(d,) for d in _device_names(config, self.size)], config, model_config)
        except BaseException:
            self.shutdown()
            raise
        logger.info("Tensor parallel: %d worker processes (pids %s)", self.size, self.pids)

    # ---- calls ----------------------------------------------------------------------------------
    def _call_all(self, method: str, *args) -> list:
        return self._call_some(list(range(self.size)), method, *args)

    def _call_each(self, method: str, per_rank_args: list[tuple]) -> list:
        return self._exchange(list(range(self.size)), [(method, a) for a in per_rank_args])

    def _call_some(self, ranks: list[int], method: str, *args) -> list:
        return self._exchange(ranks, [(method, args)] * len(ranks))

    def _exchange(self, ranks: list[int], messages: list[tuple]) -> list:
        if self.dead:
            raise EngineDeadError(self.dead)
        for rank, msg in zip(ranks, messages):
            try:
                self.conns[rank].send(msg)
            except (BrokenPipeError, OSError):
                self._die(rank, "its pipe is closed")
        results: dict[int, object] = {}
        errors: dict[int, tuple[str, str]] = {}
        waiting = {self.conns[r]: r for r in ranks}
        sentinels = {self.procs[r].sentinel: r for r in ranks}
        first_error_at = None
        while waiting:
            timeout = None if first_error_at is None else max(0.0, first_error_at + _ERROR_GRACE_S - time.monotonic())
            ready = wait(list(waiting) + list(sentinels), timeout=timeout)
            if not ready:  # some rank is stuck after another raised: the group cannot go on
                rank, (short, _) = next(iter(errors.items()))
                self._die(rank, f"it raised {short}, and rank(s) {sorted(waiting.values())} hung after it")
            for obj in ready:
                if obj in waiting:
                    rank = waiting.pop(obj)
                    try:
                        reply = obj.recv()
                    except (EOFError, OSError):
                        self._die(rank, "it closed its pipe")
                    if reply[0] == "ok":
                        results[rank] = reply[1]
                    else:
                        errors[rank] = (reply[1], reply[2])
                        first_error_at = first_error_at or time.monotonic()
                elif obj in sentinels:
                    rank = sentinels.pop(obj)
                    if self.conns[rank] in waiting and not self.conns[rank].poll():
                        self._die(rank, f"the process exited (exit code {self.procs[rank].exitcode})")
        if errors:
            rank, (short, tb) = min(errors.items())
            if len(errors) < len(ranks):  # only some ranks failed: their collectives are out of step
                self._die(rank, f"it raised {short} while the others did not")
            logger.error("Tensor-parallel step failed on every rank:\n%s", tb)
            raise WorkerStepError(f"{short} (on all {len(ranks)} tensor-parallel ranks)")
        return [results[r] for r in ranks]

    def _die(self, rank: int, why: str) -> None:
        pid = self.procs[rank].pid
        self.dead = (
            f"Tensor-parallel worker rank {rank} (pid {pid}) failed: {why}. The engine stopped all "
            f"{self.size} workers; restart it (see the log above for the cause)."
        )
        logger.error(self.dead)
        self.shutdown()
        raise EngineDeadError(self.dead)

    def check_health(self) -> None:
        if self.dead:
            raise EngineDeadError(self.dead)
        for rank, proc in enumerate(self.procs):
            if not proc.is_alive():
                self._die(rank, f"the process exited (exit code {proc.exitcode})")

    def shutdown(self) -> None:
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()


@contextlib.contextmanager
def _main_module_hidden():
    """Spawn re-runs the parent's __main__ in each child; a user script without an `if __name__ ==
    "__main__"` guard would then build another LLM in every worker. Workers need nothing from __main__
    (their arguments are wslm objects), so the spawn preparation is not told about it."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def _device_names(config, size: int) -> list[str]:
    device = config.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        import torch

        visible = torch.cuda.device_count()
        if size > visible:
            raise ValueError(
                f"tensor_parallel_size={size} needs {size} GPUs but {visible} are visible. Lower "
                "--tensor-parallel-size, or check CUDA_VISIBLE_DEVICES and `nvidia-smi`."
            )
        return [f"cuda:{r}" for r in range(size)]
    return ["cpu"] * size


def _stop_all(procs: list, conns: list) -> None:
    """Ask every worker to stop, then make sure: terminate, then kill. Safe to call twice."""
    for conn in conns:
        try:
            conn.send(("shutdown", ()))
        except (BrokenPipeError, OSError):
            pass
    deadline = time.monotonic() + 5.0
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=2.0)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=2.0)
    for conn in conns:
        try:
            conn.close()
        except OSError:
            pass
