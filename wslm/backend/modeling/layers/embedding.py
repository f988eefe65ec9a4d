"""Token embedding and LM head, vocabulary-parallel under tensor parallelism (no-ops at TP=1)."""

from __future__ import annotations

import torch

from wslm.backend.distributed.sharding import parallel_lm_head, shard_vocab, vocab_parallel_embedding


class VocabParallelEmbedding:
    """Rows of the embedding table; each rank keeps a slice of the vocabulary and the ranks sum."""

    def __init__(
        self, vocab_size: int, dtype: torch.dtype, device: torch.device, quantization: str | None = None
    ) -> None:
        self.vocab_size = vocab_size
        self.dtype = dtype
        self.device = device
        self.quantization = quantization
        self.weight = None  # a tensor, or an int8 table (GGUF files, int8/int4 on the fly)

    def load(self, tensor) -> None:
        from wslm.backend.quant.linear import prepare_weight

        tensor = shard_vocab(tensor, self.vocab_size)  # an int8 table is sliced with its row scales
        # The name only tells prepare_weight that this is a table (tables quantize to int8, never int4).
        self.weight = prepare_weight(
            tensor, self.quantization, "embed_tokens.weight", self.device, self.dtype
        )

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_embedding(ids, self.weight, self.dtype)


class ParallelLMHead(VocabParallelEmbedding):
    """Logits over the whole vocabulary (each rank computes its slice, then they gather). Tied models
    share the embedding's tensor (tie_to)."""

    def tie_to(self, embedding: VocabParallelEmbedding) -> None:
        self.weight = embedding.weight

    def __call__(self, hidden: torch.Tensor, float32: bool = False) -> torch.Tensor:
        return parallel_lm_head(hidden, self.weight, self.vocab_size, float32)
