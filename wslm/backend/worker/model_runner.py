"""ModelRunner: owns the weights and the KV pool, turns a step's plain inputs into tensors and runs it. One
entry for every executor: execute(StepInputs) offers a pure decode step to CUDA graphs or the CPU decode plan
and runs everything else (prefill, images, LoRA rows, speculative verification rows, pooling) through the
model's forward; sample_step turns rank 0's logits into tokens."""

from __future__ import annotations

import logging

import torch

from wslm.backend.engine.step_inputs import ModelRunnerOutput, SamplingBatch, StepInputs
from wslm.backend.modeling import get_model_class
from wslm.backend.modeling.layers.attention import AttentionMetadata
from wslm.backend.platforms.kv_cache import allocate_pool
from wslm.backend.worker.prompt_logprobs import compute_prompt_logprobs
from wslm.backend.worker.sampler import Sampler

logger = logging.getLogger(__name__)


def load_model(source, mc, device: torch.device, embedding: bool = False, lora_path: str | None = None,
               no_mmap: bool = False):
    """Build the model for mc (its family's class) and load its weights (this rank's shard under tensor
    parallelism). embedding: an embedding checkpoint, which may be a bare decoder body (pooling/decoder.py).
    lora_path: a LoRA adapter merged into the weights (loader/lora.py). no_mmap: weights read into memory of
    their own, not views of the mapped file (iter_weights)."""
    from wslm.backend.loader.model_loader import decoder_body_weights, iter_weights, return_freed_heap

    model = get_model_class(mc.architecture)(mc, device)
    weights = iter_weights(source, mc.dtype, getattr(mc, "quantization", None), no_mmap=no_mmap)
    if embedding:
        weights = decoder_body_weights(weights)
    model.load_weights(weights)
    if lora_path:
        from wslm.backend.loader.lora import merge_lora

        logger.info("LoRA adapter %s merged into %d projections", lora_path, merge_lora(model, lora_path))
    # Loading makes many short-lived buffers (each tensor, or MoE expert, being repacked), and glibc keeps
    # freed heap mapped: resident memory after a quantized load stayed near its peak (measured: +100 MB on
    # a 250 MB MoE GGUF). GGUF weights are trimmed after each tensor already; safetensors at the end.
    return_freed_heap()
    return model


class ModelRunner:
    def __init__(self, model, block_size: int, num_blocks: int) -> None:
        self.model = model
        self.cfg = model.cfg
        self.device = model.device
        self.block_size = block_size
        self.num_blocks = num_blocks
        kv_heads = getattr(model, "num_kv_heads", self.cfg.num_kv_heads)  # this rank's, under tensor parallelism
        shape = (num_blocks, block_size, kv_heads, self.cfg.head_dim)
        # One allocation for the whole pool: [layers, k|v, blocks, block_size, kv_heads, head_dim].
        kv_dtype = getattr(self.cfg, "kv_cache_dtype", None) or self.cfg.dtype
        self.kv_pool = allocate_pool((self.cfg.num_layers, 2, *shape), kv_dtype, self.device)
        self.kv_caches = [(self.kv_pool[i, 0], self.kv_pool[i, 1]) for i in range(self.cfg.num_layers)]
        self.graphs = None  # DecodeGraphs, when CUDA graphs are on
        self.cpu_plan = None  # CpuDecodePlan: pure decode steps on CPU through the fast back ends
        self.image_embedder = None  # ImageEmbedder, made at a vision model's first image
        if self.device.type == "cpu":
            from wslm.backend.platforms.cpu.decode_plan import CpuDecodePlan

            self.cpu_plan = CpuDecodePlan.build(model, self.kv_pool)
        self.kv_cache_bytes = self.kv_pool.numel() * self.kv_pool.element_size()
        self.lora = None  # LoraManager (wslm/backend/lora) with enable_lora: adapters per request

    def enable_lora(self, max_loras: int, max_lora_rank: int, max_cpu_loras: int | None = None) -> None:
        from wslm.backend.lora.manager import LoraManager

        self.lora = LoraManager(self.model, max_loras, max_lora_rank, max_cpu_loras)

    def enable_cuda_graphs(self, max_num_seqs: int, max_model_len: int) -> None:
        from wslm.backend.platforms.cuda.graphs import DecodeGraphs

        graphs = DecodeGraphs(self.model, self.kv_caches, max_num_seqs, max_model_len, self.block_size)
        if graphs.capture():
            self.graphs = graphs

    def enable_cpu_compile(self, enforce_eager: bool = False) -> None:
        """Compile the CPU decode step in the background (decode_plan.py); eager until it is ready."""
        if self.cpu_plan is not None:
            self.cpu_plan.enable_compile(self.model, self.kv_pool, enforce_eager)

    def start_cpu_compile(self) -> None:
        """Start the background compile now rather than at the first batch (the server, once it is ready)."""
        if self.cpu_plan is not None:
            self.cpu_plan.start_compile()

    def decode_row_budget(self) -> int | None:
        """Decode rows the CPU's C step takes at once (platforms/cpu/decode_rows.py); None elsewhere."""
        if self.cpu_plan is None or self.cpu_plan.native is None:
            return None
        from wslm.backend.platforms.cpu.decode_rows import MAX_ROWS

        return MAX_ROWS

    # The CPU decode back ends, for tests and benchmarks to read (the plan holds them).
    @property
    def cpu_decode(self):
        return self.cpu_plan.eager if self.cpu_plan is not None else None

    @property
    def native(self):
        return self.cpu_plan.native if self.cpu_plan is not None else None

    @property
    def compiled(self):
        return self.cpu_plan.compiled if self.cpu_plan is not None else None

    def weights_updated(self) -> None:
        """Call after replacing the model's weight tensors once loaded (a weight update; tests that swap in
        another format's weights): the decode back ends bound the old tensors. They bind the new ones; the
        compiled CPU graph and CUDA graphs, which froze the old ones, are dropped (eager serves)."""
        if self.cpu_plan is not None:
            self.cpu_plan.weights_updated()
        self.graphs = None

    def shutdown(self) -> None:
        pass  # one process: nothing to stop

    def check_health(self) -> None:
        pass

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        if not pairs:
            return
        src = torch.tensor([s for s, _ in pairs], device=self.device)
        dst = torch.tensor([d for _, d in pairs], device=self.device)
        self.kv_pool[:, :, dst] = self.kv_pool[:, :, src]

    def tensorize(self, step: StepInputs):
        dev = self.device

        def t(values, dtype):
            return torch.tensor(values, dtype=dtype, device=dev)

        meta = AttentionMetadata(
            slot_mapping=t(step.slots, torch.int64),
            block_tables=t(step.block_tables, torch.int32),
            cu_seqlens_q=t(step.cu_seqlens_q, torch.int32),
            seq_lens=t(step.seq_lens, torch.int32),
            logits_indices=t(step.logits_indices, torch.int64),
            max_seqlen_q=step.max_seqlen_q,
            max_seqlen_k=max(step.seq_lens),
            prompt_logprobs=step.prompt_logprob_rows > 0,
        )
        return t(step.input_ids, torch.int64), t(step.positions, torch.int64), meta

    def execute(self, step: StepInputs) -> torch.Tensor | None:
        """Run one step: the logits of step.logits_indices' rows (the sampled rows, then the prompt_logprobs
        rows), None when it has none; a pooling step: the final normed hidden states of those rows."""
        input_ids, positions, meta = self.tensorize(step)
        if step.pooling:  # embedding requests (pooling/decoder.py): the last prompt token of each finished prompt
            return self.model.forward_hidden(input_ids, positions, meta, self.kv_caches)
        # A step with LoRA rows runs the eager forward (the fast decode paths bind the base weights only).
        lora = self.lora is not None and bool(step.lora) and self.lora.begin_step(step.lora)
        try:
            if step.images:  # a prefill with image tokens: their embeddings come from the vision encoder
                logits = self._forward_images(input_ids, positions, meta, step.images)
                return logits if step.logits_indices else None
            # Every row one token, every row sampled (a speculative sequence's drafts are rows of their own).
            is_decode = (meta.max_seqlen_q == 1 and len(step.logits_indices) == len(step.input_ids)
                         and not lora)
            if self.graphs is not None and is_decode and self.graphs.can_run(input_ids.shape[0]):
                return self.graphs.run(input_ids, positions, meta)
            if self.cpu_plan is not None and is_decode:
                logits = self.cpu_plan.run(input_ids, positions, meta)
                if logits is not None:
                    return logits
            logits = self.model.forward(input_ids, positions, meta, self.kv_caches)
        finally:
            if lora:
                self.lora.end_step()
        return logits if step.logits_indices else None

    def _forward_images(self, input_ids, positions, meta, images: list) -> torch.Tensor:
        if self.image_embedder is None:
            from wslm.backend.worker.image_embeds import ImageEmbedder

            self.image_embedder = ImageEmbedder(self.model)
        embeds = self.image_embedder.embeds(input_ids, images)
        if getattr(self.model, "mrope", False):  # Qwen2.5-VL: image tokens take their grid's [3, N] positions
            positions = self.model.image_positions(positions, images)
        if getattr(self.model, "bidirectional_images", False):
            from wslm.backend.worker.image_embeds import image_spans

            meta.image_spans = image_spans(images)
        return self.model.forward(input_ids, positions, meta, self.kv_caches, inputs_embeds=embeds)


def sample_step(logits: torch.Tensor, batch: SamplingBatch, sampler: Sampler, vocab_size: int
                ) -> ModelRunnerOutput:
    """The step's logits (sampled rows, then prompt_logprobs rows) -> its tokens and prompt_logprobs. The
    batch's rows: one SampleRow per token to sample; sample_rows: the logits row of each (an n > 1 request's
    siblings forked this step share their parent's). A speculative step's drafts are verified
    (spec_decode/step.py)."""
    num_sampled = logits.shape[0] - sum(len(targets) for targets, _ in batch.prompt_targets)
    prompt = (compute_prompt_logprobs(batch.prompt_targets, logits[num_sampled:], vocab_size)
              if batch.prompt_targets else [])
    if not batch.rows:
        return ModelRunnerOutput([], [], prompt)
    if batch.drafts is not None:
        from wslm.backend.spec_decode.step import sample_speculative

        return sample_speculative(sampler, logits, batch, prompt)
    rows = logits[:num_sampled]
    if batch.sample_rows != list(range(num_sampled)):
        rows = rows.index_select(0, torch.tensor(batch.sample_rows, device=rows.device))
    bitmask = (batch.bitmask_rows, batch.bitmask) if batch.bitmask is not None else None
    result = sampler(rows, batch.rows, bitmask)
    return ModelRunnerOutput(result.token_ids, result.logprobs, prompt)
