"""Decoder embedding models (Qwen3-Embedding, gte-Qwen2, e5-mistral: last-token pooling) inside LLMEngine.

An embedding request is a sequence that only prefills: the scheduler runs its prompt (in chunks, batched
with the others, prefix cache included), the step that completes the prompt returns the final normed
hidden state of its last token instead of logits, and the sequence finishes at once, so its KV blocks go
back to the pool in the same step (nothing is kept, nothing is generated)."""

from __future__ import annotations

import json
import logging
import time

import torch

from wslm.backend.frontend.validation import validate_prompt
from wslm.backend.modeling.pooler import check_dimensions, finish, pooler_config
from wslm.backend.outputs import PoolingOutput, PoolingRequestOutput
from wslm.backend.pooling_params import PoolingParams
from wslm.backend.sampling_params import SamplingParams
from wslm.backend.sequence import RequestState, Sequence

logger = logging.getLogger("wslm.engine")


class DecoderPooling:
    def __init__(self, source, mc, config) -> None:
        if config.tensor_parallel_size > 1:
            raise ValueError("Embedding models run on one device here: drop --tensor-parallel-size.")
        folder = None if source.gguf_file else source.folder
        hf: dict = {}
        if folder is not None and (folder / "config.json").is_file():
            hf = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        self.pooler = pooler_config(folder, hf, is_encoder=False)
        if self.pooler.pooling != "last":
            raise ValueError(f"{self.pooler.pooling} pooling ({self.pooler.source}) is not supported for decoder "
                             "embedding models: wslm pools their last token (as Qwen3-Embedding, gte-Qwen2 and "
                             "e5-mistral do).")
        self.hidden_size = mc.hidden_size
        self.model_name = source.name
        # Embedding checkpoints ship without an LM head: the tied embedding stands in (never used).
        mc.tie_word_embeddings = True
        logger.info("Embedding model: last-token pooling (from %s), normalised, %d-dim vectors%s", self.pooler.source,
                    mc.hidden_size, "; Matryoshka `dimensions` allowed" if self.pooler.matryoshka else "")

    def add_request(self, engine, request_id: str, prompt, params: PoolingParams, arrival: float) -> None:
        # Prefill only: one "token" of room keeps the scheduler's accounting as for any prompt.
        sampling = SamplingParams(max_tokens=1)
        text, ids = validate_prompt(prompt, sampling, engine.tokenizer, engine.limits)
        check_dimensions(params.dimensions, self.hidden_size, self.pooler, self.model_name)
        seq = Sequence(engine._next_seq_id, request_id, 0, ids, sampling, arrival, frozenset())
        engine._next_seq_id += 1
        seq.pooling = params
        engine.requests[request_id] = RequestState(request_id, text, ids, [seq], arrival)
        engine.scheduler.add(seq)

    def step(self, engine, sched) -> list[PoolingRequestOutput]:
        """Run one scheduled step; answer the requests whose prompt is now complete."""
        try:
            hidden, done = engine.runner.execute_pooling(sched.scheduled)
            for seq, n in sched.scheduled:
                seq.num_computed_tokens += n
                engine.block_manager.cache_full_blocks(seq)
        except Exception as exc:  # noqa: BLE001 - one broken step fails its requests, not the server
            logger.exception("Embedding step failed")
            message = f"The engine failed on this request: {type(exc).__name__}: {exc}"
            return [self._finish(engine, seq, None, message) for seq, _ in sched.scheduled]
        outputs = []
        for i, seq in enumerate(done):
            p: PoolingParams = seq.pooling
            normalize = self.pooler.normalize if p.normalize is None else p.normalize
            vector = finish(hidden[i], p.dimensions, normalize).float().cpu()
            engine.prompt_tokens_total += seq.num_prompt_tokens
            outputs.append(self._finish(engine, seq, vector, None))
        return outputs

    def abort(self, engine, request_id: str) -> None:
        req = engine.requests.get(request_id)
        if req is not None:
            engine._pending.append(self._finish(engine, req.seqs[0], None, "aborted"))

    @staticmethod
    def _finish(engine, seq: Sequence, vector: torch.Tensor | None, error: str | None) -> PoolingRequestOutput:
        if not seq.is_finished:
            seq.finish_reason = "stop" if error is None else "abort" if error == "aborted" else "error"
            seq.finished_time = time.monotonic()
            engine.scheduler.finish(seq)  # frees its KV blocks now: nothing is kept for an embedding
        engine.requests.pop(seq.request_id, None)
        output = PoolingOutput(vector) if vector is not None else None
        return PoolingRequestOutput(seq.request_id, output, seq.prompt_token_ids, True, error=error)
