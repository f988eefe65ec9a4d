"""UniProcExecutor: the model in this process, on one device (a CPU or one GPU)."""

from __future__ import annotations

import torch

from wslm.backend.executor.abstract import Executor
from wslm.backend.platforms.kv_cache import determine_num_blocks
from wslm.backend.worker.model_runner import ModelRunner, finish_step, load_model
from wslm.backend.worker.sampler import Sampler
from wslm.backend.worker.step_inputs import ModelRunnerOutput, SchedulerOutput


class UniProcExecutor(Executor):
    def __init__(self, config, source, model_config, device: torch.device, embedding: bool = False) -> None:
        self.config = config
        self.device = device
        self.embedding = embedding
        self.vocab_size = model_config.vocab_size
        model = load_model(source, model_config, device, embedding=embedding, lora_path=config.lora_path,
                           no_mmap=config.no_mmap)
        self.block_size = config.block_size
        self.num_blocks = determine_num_blocks(config, model_config, device)
        self.runner = ModelRunner(model, config.block_size, self.num_blocks)
        self.kv_cache_bytes = self.runner.kv_cache_bytes
        if getattr(config, "enable_lora", False) and not embedding:
            self.runner.enable_lora(config.max_loras, config.max_lora_rank, config.max_cpu_loras)
        self.sampler = Sampler(model_config.vocab_size, device, config.seed)

    def warm_up(self, max_num_seqs: int, max_model_len: int, enforce_eager: bool) -> None:
        if self.embedding:
            return  # CUDA graphs and the compiled CPU step serve decode steps, which an embedding model never runs
        if self.device.type == "cuda" and not enforce_eager:
            self.runner.enable_cuda_graphs(max_num_seqs, max_model_len)
        if self.device.type == "cpu":
            self.runner.enable_cpu_compile(enforce_eager)

    def start_background_compile(self) -> None:
        if not self.embedding:
            self.runner.start_cpu_compile()

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        logits, sampled = self.runner.execute(so.scheduled)
        return finish_step(logits, len(sampled), so.sample_rows, so.sample_seqs, so.prompt_targets(), self.sampler,
                           self.vocab_size)

    def execute_pooling(self, scheduled: list) -> tuple[torch.Tensor, list]:
        return self.runner.execute_pooling(scheduled)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        self.runner.copy_blocks(pairs)
