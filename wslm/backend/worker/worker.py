"""Worker: one rank. It holds 1/N of the weights (all of them on one device) and its own slice of the KV pool,
and runs the steps the engine's executor sends it: StepInputs on every rank, a SamplingBatch for rank 0,
which samples. Every executor drives it the same way: the one-device executor holds one in its own process
(rank 0 of 1, called directly); the mp and ray executors one per tensor-parallel rank (a method name and
arguments in, a result out)."""

from __future__ import annotations

import logging
import os
import traceback

import torch

from wslm.backend.config import EngineConfig
from wslm.backend.distributed.parallel_state import destroy_tensor_parallel, init_tensor_parallel
from wslm.backend.engine.step_inputs import ModelRunnerOutput, SamplingBatch, StepInputs
from wslm.backend.loader.model_source import ModelSource
from wslm.backend.worker.model_runner import ModelRunner, sample_step
from wslm.backend.worker.sampler import Sampler

logger = logging.getLogger("wslm.worker")


class Worker:
    def __init__(self, config: EngineConfig, source: ModelSource, model_config, rank: int = 0, size: int = 1,
                 init_method: str | None = None) -> None:  # fmt: skip
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
        self.embedding = False  # an embedding model: pooling steps only (no CUDA graphs, no compiled step)
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

    def init_device(self, device: str | torch.device, init_method: str | None = None) -> int:
        if init_method:
            self.init_method = init_method
        self.device = torch.device(device)
        if self.size == 1:
            return os.getpid()  # one device: no group to join, and the threads stay as the platform set them
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

    def load_model(self, embedding: bool = False) -> None:
        """embedding: an embedding checkpoint (one device only), which may be a bare decoder body."""
        from wslm.backend.worker.model_runner import load_model

        self.embedding = embedding
        self.model = load_model(self.source, self.mc, self.device, embedding=embedding,
                                lora_path=self.config.lora_path, no_mmap=self.config.no_mmap)

    def determine_num_blocks(self, extra_kv_bytes_per_token: int = 0) -> int:
        """The KV pool's blocks; extra_kv_bytes_per_token: another pool's keys and values with the same block
        ids (a speculative draft model's), counted in the same budget."""
        import dataclasses

        from wslm.backend.distributed.sharding import local_num_kv_heads
        from wslm.backend.platforms.kv_cache import determine_num_blocks

        local = self.mc
        if self.size > 1:
            local = dataclasses.replace(self.mc, num_kv_heads=local_num_kv_heads(self.mc.num_kv_heads))
        return determine_num_blocks(self.config, local, self.device, extra_kv_bytes_per_token)

    def init_cache(self, num_blocks: int) -> int:
        """Allocate this rank's KV slice (and the LoRA slots, with --enable-lora); returns its bytes."""
        self.runner = ModelRunner(self.model, self.config.block_size, num_blocks)
        if getattr(self.config, "enable_lora", False) and not self.embedding:  # one device (config checks)
            self.runner.enable_lora(self.config.max_loras, self.config.max_lora_rank, self.config.max_cpu_loras)
        self.sampler = Sampler(self.mc.vocab_size, self.device, self.config.seed)
        return self.runner.kv_cache_bytes

    def warm_up(self, max_num_seqs: int, max_model_len: int, enforce_eager: bool) -> bool:
        """Once max_model_len is known: CUDA graphs, the compiled CPU decode step. True when graphs are on."""
        if self.embedding:
            return False  # both serve decode steps, which an embedding model never runs
        if self.device.type == "cuda" and not enforce_eager:
            self.runner.enable_cuda_graphs(max_num_seqs, max_model_len)
        if self.device.type == "cpu":
            self.runner.enable_cpu_compile(enforce_eager)
        return self.runner.graphs is not None

    def drop_cuda_graphs(self) -> None:
        self.runner.graphs = None

    def start_background_compile(self) -> None:
        if not self.embedding:
            self.runner.start_cpu_compile()

    # ---- per step -----------------------------------------------------------------------------
    def execute_step(self, step: StepInputs, batch: SamplingBatch | None = None
                     ) -> ModelRunnerOutput | torch.Tensor | None:
        """Run the step on this rank's shard. Rank 0 (every rank holds the gathered logits) samples and
        answers for all: token ids and the logprobs asked for, never the logits (a ModelRunnerOutput; None
        from the other ranks, or when the step has no logits rows). A pooling step: the hidden states."""
        out = self.runner.execute(step)
        if step.pooling:
            return out
        if self.rank != 0 or out is None or batch is None:
            return None
        for seq_id in batch.finished_seq_ids:
            self._generators.pop(seq_id, None)
        for row in batch.rows:  # a seeded request draws from its own generator, kept here between steps
            if row.params.seed is not None:
                row.generator = self._generators.get(row.seq_id)
                if row.generator is None:
                    row.generator = self._generators[row.seq_id] = torch.Generator(device=out.device)
                    row.generator.manual_seed(row.params.seed)
        return sample_step(out, batch, self.sampler, self.mc.vocab_size)

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
