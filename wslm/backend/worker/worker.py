"""Worker: one tensor-parallel rank. It holds 1/N of the weights and its own slice of the KV pool and runs
the steps the engine (rank-less, in the engine process) sends it. The mp and ray executors drive it the same
way: a method name and arguments in, a result out."""

from __future__ import annotations

import logging
import os
import traceback

import torch

from wslm.backend.config import EngineConfig
from wslm.backend.distributed.parallel_state import destroy_tensor_parallel, init_tensor_parallel
from wslm.backend.loader.model_source import ModelSource
from wslm.backend.worker.model_runner import ModelRunner, finish_step
from wslm.backend.worker.sampler import Sampler
from wslm.backend.worker.step_inputs import ModelRunnerOutput, SamplingBatch, StepInputs

logger = logging.getLogger("wslm.worker")


class Worker:
    def __init__(self, config: EngineConfig, source: ModelSource, model_config, rank: int, size: int,
                 init_method: str) -> None:  # fmt: skip
        self.config = config
        self.source = source
        self.mc = model_config
        self.rank = rank
        self.size = size
        self.init_method = init_method
        self.device = torch.device("cpu")
        self.model = None
        self.runner = None
        self.sampler = None  # rank 0 samples (init_cache makes it)
        self._generators: dict[int, torch.Generator] = {}  # seeded sequences' own, by seq_id

    # ---- start-up, in the order the executor calls them --------------------------------------
    def node_address(self) -> tuple[str, int]:
        """Where rank 0 can be reached for the process group (Ray: the node it was placed on)."""
        import socket

        from wslm.backend.distributed.net import free_port

        host = socket.gethostbyname(socket.gethostname())
        try:
            import ray

            host = ray.util.get_node_ip_address()
        except Exception:  # noqa: BLE001 — no Ray: this machine
            pass
        return host, free_port("0.0.0.0")

    def init_device(self, device: str, init_method: str | None = None) -> int:
        if init_method:
            self.init_method = init_method
        self.device = torch.device(device)
        if self.device.type == "cuda":
            self.device = torch.device("cuda", self.device.index if self.device.index is not None else 0)
            torch.cuda.set_device(self.device)
            backend = "nccl"
        else:
            # N ranks share the cores: each takes its share, or they fight over the same ones.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.size))
            backend = "gloo"
        init_tensor_parallel(self.rank, self.size, self.init_method, backend)
        return os.getpid()

    def load_model(self) -> None:
        from wslm.backend.worker.model_runner import load_model

        self.model = load_model(self.source, self.mc, self.device, lora_path=self.config.lora_path,
                                use_mmap=not self.config.no_mmap)

    def determine_num_blocks(self) -> int:
        import dataclasses

        from wslm.backend.distributed.sharding import local_num_kv_heads
        from wslm.backend.platforms.kv_cache import determine_num_blocks

        local = dataclasses.replace(self.mc, num_kv_heads=local_num_kv_heads(self.mc.num_kv_heads))
        return determine_num_blocks(self.config, local, self.device)

    def init_cache(self, num_blocks: int) -> int:
        """Allocate this rank's KV slice; returns its bytes."""
        self.runner = ModelRunner(self.model, self.config.block_size, num_blocks)
        self.sampler = Sampler(self.mc.vocab_size, self.device, self.config.seed)
        return self.runner.kv_pool.numel() * self.runner.kv_pool.element_size()

    # ---- per step -----------------------------------------------------------------------------
    def execute_step(self, step: StepInputs, batch: SamplingBatch | None = None) -> ModelRunnerOutput | None:
        """Run the step on this rank's shard. Rank 0 (every rank holds the gathered logits) samples and
        answers for all: token ids and the logprobs asked for, never the logits."""
        logits = self.runner.execute_step(step)
        if self.rank != 0 or logits is None or batch is None:
            return None
        for seq_id in batch.finished_seq_ids:
            self._generators.pop(seq_id, None)
        for row in batch.rows:  # a seeded request draws from its own generator, kept here between steps
            if row.params.seed is not None:
                row.generator = self._generators.get(row.seq_id)
                if row.generator is None:
                    row.generator = self._generators[row.seq_id] = torch.Generator(device=logits.device)
                    row.generator.manual_seed(row.params.seed)
        num_sampled = logits.shape[0] - sum(len(targets) for targets, _ in batch.prompt_targets)
        bitmask = (batch.bitmask_rows, batch.bitmask) if batch.bitmask is not None else None
        return finish_step(logits, num_sampled, batch.sample_rows, batch.rows, batch.prompt_targets, self.sampler,
                           self.mc.vocab_size, bitmask)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        self.runner.copy_blocks(pairs)

    def comm_profile(self, enable: bool | None = None) -> tuple[float, int]:
        from wslm.backend.distributed.parallel_state import comm_profile

        return comm_profile(enable)

    def weight_bytes(self) -> dict[str, int]:
        """This rank's share of the weights (tests check it is 1/N; bench/tp.py reports it)."""
        from wslm.backend.modeling.weight_bytes import weight_bytes

        return weight_bytes(self.model)

    def ping(self) -> int:
        return self.rank

    def close(self) -> None:
        destroy_tensor_parallel()


def _die_with_parent() -> None:
    """Linux: the kernel kills this worker when the engine process dies, even by SIGKILL (no orphans
    holding the GPU or the port)."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def worker_main(conn, config, source, model_config, rank: int, size: int, init_method: str) -> None:
    """Entry point of an mp worker process: answer calls on conn until told to stop or the engine goes."""
    _die_with_parent()
    if os.getppid() == 1:  # the engine died before the line above took effect
        return
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the engine, which stops us in order
    worker = Worker(config, source, model_config, rank, size, init_method)
    try:
        while True:
            try:
                method, args = conn.recv()
            except (EOFError, OSError):
                break
            if method == "shutdown":
                break
            try:
                conn.send(("ok", getattr(worker, method)(*args)))
            except BaseException as exc:  # noqa: BLE001 — reported to the engine, which decides
                conn.send(("err", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
    finally:
        try:
            worker.close()
        except Exception:  # noqa: BLE001
            pass
