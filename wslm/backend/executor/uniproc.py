"""UniProcExecutor: the model in this process, on one device (a CPU or one GPU): one Worker, rank 0 of 1,
called directly, through the same step as the tensor-parallel executors (abstract.py)."""

from __future__ import annotations

import torch

from wslm.backend.engine.scheduler_output import SchedulerOutput
from wslm.backend.engine.step_inputs import ModelRunnerOutput, SamplingBatch, StepInputs
from wslm.backend.executor.abstract import Executor
from wslm.backend.structured.mask import GrammarMasker
from wslm.backend.worker.worker import Worker


class UniProcExecutor(Executor):
    def __init__(self, config, source, model_config, device: torch.device, embedding: bool = False) -> None:
        self.config = config
        self.device = device
        self.embedding = embedding
        self.vocab_size = model_config.vocab_size
        self.masker = GrammarMasker(model_config.vocab_size)
        self.worker = Worker(config, source, model_config)
        self.worker.init_device(device)
        self.worker.load_model(embedding)
        self.block_size = config.block_size
        self.draft = None  # spec_decode.draft.DraftProposer: a draft model proposes before each speculative step
        spec = config.speculative()
        loaded = None
        if spec is not None and spec.method == "draft_model" and not embedding:
            from wslm.backend.spec_decode.draft import DraftProposer, load_draft

            loaded = load_draft(spec.model, model_config, device, config.trust_remote_code)
        # A draft's pool has the target's block ids: each block costs both models' keys and values.
        self.num_blocks = self.worker.determine_num_blocks(loaded.mc.kv_bytes_per_token() if loaded else 0)
        self.kv_cache_bytes = self.worker.init_cache(self.num_blocks)
        if loaded is not None:
            self.draft = DraftProposer.build(loaded, model_config, self.block_size, self.num_blocks)
            self.kv_cache_bytes += self.draft.runner.kv_cache_bytes

    @property
    def runner(self):
        """The worker's ModelRunner (tests and benches read its model, KV pool and decode back ends)."""
        return self.worker.runner

    def warm_up(self, max_num_seqs: int, max_model_len: int, enforce_eager: bool) -> None:
        self.worker.warm_up(max_num_seqs, max_model_len, enforce_eager)

    def decode_row_budget(self) -> int | None:
        return self.worker.runner.decode_row_budget()

    def start_background_compile(self) -> None:
        self.worker.start_background_compile()

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput:
        spec = so.spec if self.draft is not None else None
        if spec is not None and spec.seqs:  # the drafts go in before the step's rows are laid out
            drafts = self.draft.propose(spec.seqs, [len(s.spec_token_ids) for s in spec.seqs])
            for seq, d in zip(spec.seqs, drafts):
                seq.spec_token_ids[:] = d
        result = super().execute(so)
        if spec is not None and result.spec_token_ids is not None:
            for seq, toks in zip(so.sample_seqs, result.spec_token_ids):
                if seq.spec_token_ids:
                    self.draft.verified(seq, len(toks), len(seq.spec_token_ids))
        return result

    def _execute_step(self, step: StepInputs, batch: SamplingBatch | None):
        return self.worker.execute_step(step, batch)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        self.worker.copy_blocks(pairs)
