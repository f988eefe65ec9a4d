"""Decoder embedding models (Qwen3-Embedding, gte-Qwen2, e5-mistral: last-token pooling) inside LLMEngine.

An embedding request is a sequence that only prefills: the scheduler runs its prompt (in chunks, batched
with the others, prefix cache included), the step that completes the prompt returns the final normed
hidden state of its last token instead of logits, and the sequence finishes at once, so its KV blocks go
back to the pool in the same step (nothing is kept, nothing is generated)."""

from __future__ import annotations

import json
import logging

import torch

from wslm.backend.modeling.pooler import check_dimensions, finish, pooler_config
from wslm.backend.outputs import PoolingOutput, PoolingRequestOutput
from wslm.backend.pooling_params import PoolingParams
from wslm.backend.sequence import Sequence

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

    def process(self, processor, request_id: str, prompt, params: PoolingParams, arrival: float | None):
        """The request's EngineRequest (its prompt checked as any prompt, its dimensions against the model)."""
        req = processor.process_pooling(request_id, prompt, params, arrival)
        check_dimensions(params.dimensions, self.hidden_size, self.pooler, self.model_name)
        return req

    def step(self, core) -> list[PoolingRequestOutput]:
        """Run one scheduled step; answer the requests whose prompt is now complete (or failed)."""
        hidden, done, failed = core.step_pooling()
        outputs = [self._output(core, core.requests[f.request_id].seqs[0], None, f.message) for f in failed]
        for i, seq in enumerate(done):
            p: PoolingParams = seq.pooling
            normalize = self.pooler.normalize if p.normalize is None else p.normalize
            vector = finish(hidden[i], p.dimensions, normalize).float().cpu()
            core.prompt_tokens_total += seq.num_prompt_tokens
            outputs.append(self._output(core, seq, vector, None))
        return outputs

    def abort(self, core, request_id: str) -> PoolingRequestOutput | None:
        req = core.requests.get(request_id)
        return None if req is None else self._output(core, req.seqs[0], None, "aborted")

    @staticmethod
    def _output(core, seq: Sequence, vector: torch.Tensor | None, error: str | None) -> PoolingRequestOutput:
        if not seq.is_finished:  # frees its KV blocks now: nothing is kept for an embedding
            core.finish(seq, "stop" if error is None else "abort" if error == "aborted" else "error")
        core.drop(seq.request_id)
        output = PoolingOutput(vector) if vector is not None else None
        return PoolingRequestOutput(seq.request_id, output, seq.prompt_token_ids, True, error=error)
