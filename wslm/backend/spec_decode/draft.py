"""A draft model (vLLM's "draft_model" method): a smaller model with the target's tokenizer proposes k tokens
greedily, one batched forward per token. It keeps its own KV pool with the target's block ids, so it writes
into the blocks the scheduler gave the sequence and needs no bookkeeping of its own beyond how many of each
sequence's tokens it has computed (a new, forked or preempted sequence catches up in one chunk)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from wslm.backend.engine.step_inputs import StepInputs
from wslm.backend.worker.model_runner import ModelRunner, load_model

logger = logging.getLogger("wslm.engine")


def check_draft_tokenizer(target_tokenizer, draft_model: str, trust_remote_code: bool = False) -> None:
    """The draft must speak the target's token ids: the same vocabulary, id for id. Raises ValueError."""
    from wslm.backend.loader.model_loader import load_tokenizer, resolve_model

    try:
        draft = load_tokenizer(resolve_model(draft_model), None, trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ValueError(f"speculative_config: cannot load the draft model {draft_model!r} ({exc}). Give a model "
                         "folder, a .gguf file or a model id that `wslm models` lists.") from exc
    mine, theirs = target_tokenizer.get_vocab(), draft.get_vocab()
    if mine != theirs:
        differ = len(set(mine.items()) ^ set(theirs.items()))
        raise ValueError(f"speculative_config: the draft model {draft_model!r} has another tokenizer than the "
                         f"served model ({len(theirs)} vs {len(mine)} tokens, {differ} entries differ); a draft "
                         "must use the same tokenizer (pick a smaller model of the same family), or use "
                         '"method": "ngram", which needs no second model.')


@dataclass(slots=True)
class LoadedDraft:
    model: Any
    mc: Any  # its ModelConfig
    name: str


def load_draft(model: str, target_mc, device: torch.device, trust_remote_code: bool = False) -> LoadedDraft:
    """The draft model, loaded before the KV pool is sized (its keys and values share the pool's budget, and on a
    GPU its weights the card's); DraftProposer.build gives it its pool."""
    from wslm.backend.loader.model_loader import load_model_config, load_tokenizer, resolve_model

    source = resolve_model(model)
    source.mmproj = None  # a draft proposes text: a vision projector beside its GGUF is not loaded
    tokenizer = load_tokenizer(source, None, trust_remote_code)
    _, mc = load_model_config(source, tokenizer, "auto" if target_mc.dtype is None else str(target_mc.dtype)
                              .removeprefix("torch."), device, trust_remote_code)
    mc.kv_cache_dtype = getattr(target_mc, "kv_cache_dtype", None)
    if mc.vocab_size < target_mc.vocab_size - 1024 or mc.vocab_size > target_mc.vocab_size + 1024:
        raise ValueError(f"speculative_config: the draft model's vocabulary ({mc.vocab_size}) does not match the "
                         f"served model's ({target_mc.vocab_size}); use a draft of the same family and tokenizer.")
    return LoadedDraft(load_model(source, mc, device), mc, source.name)


class DraftProposer:
    @classmethod
    def build(cls, draft: LoadedDraft, target_mc, block_size: int, num_blocks: int) -> DraftProposer:
        """A loaded draft with its KV pool: the target's block count (the same block ids)."""
        runner = ModelRunner(draft.model, block_size, num_blocks)
        logger.info("Speculative draft model %s loaded (%s, its own KV pool of %d blocks, %.2f GiB, counted in the "
                    "KV budget)", draft.name, draft.mc.architecture, num_blocks, runner.kv_cache_bytes / 2**30)
        return cls(runner, min(draft.mc.vocab_size, target_mc.vocab_size))

    def __init__(self, runner: ModelRunner, vocab_size: int) -> None:
        self.runner = runner
        self.vocab_size = vocab_size
        self.block_size = runner.block_size
        self._computed: dict[int, tuple[int, int]] = {}  # seq_id -> (num_preemptions, tokens with draft KV)

    def _slot(self, seq, pos: int) -> int:
        return seq.block_table[pos // self.block_size] * self.block_size + pos % self.block_size

    def _run(self, seqs: list, chunks: list[list[int]], starts: list[int]) -> list[int]:
        """One forward of each sequence's chunk at its start position; the argmax after each chunk."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        cu = [0]
        lens: list[int] = []
        for seq, chunk, start in zip(seqs, chunks, starts):
            ids.extend(chunk)
            positions.extend(range(start, start + len(chunk)))
            slots.extend(self._slot(seq, p) for p in range(start, start + len(chunk)))
            cu.append(cu[-1] + len(chunk))
            lens.append(start + len(chunk))
        max_blocks = -(-max(lens) // self.block_size)
        tables = [s.block_table[:max_blocks] + [0] * (max_blocks - len(s.block_table)) for s in seqs]
        step = StepInputs(ids, positions, slots, cu, lens, [c - 1 for c in cu[1:]], tables,
                          max(len(c) for c in chunks))
        input_ids, pos_t, meta = self.runner.tensorize(step)
        logits = None
        if step.max_seqlen_q == 1 and self.runner.cpu_plan is not None:
            logits = self.runner.cpu_plan.run(input_ids, pos_t, meta)
        if logits is None:
            logits = self.runner.model.forward(input_ids, pos_t, meta, self.runner.kv_caches)
        return logits[:, : self.vocab_size].argmax(dim=-1).tolist()

    @torch.inference_mode()
    def propose(self, seqs: list, ks: list[int]) -> list[list[int]]:
        """k tokens for each sequence (a decode: all its tokens but the last have target KV; the scheduler
        gave it slots up to k positions ahead)."""
        if len(self._computed) > 4 * len(seqs) + 256:  # forget finished sequences now and then
            live = {q.seq_id for q in seqs}
            self._computed = {s: v for s, v in self._computed.items() if s in live}
        chunks, starts = [], []
        for seq in seqs:
            pre, done = self._computed.get(seq.seq_id, (seq.num_preemptions, 0))
            if pre != seq.num_preemptions:
                done = 0
            done = min(done, seq.num_tokens - 1)
            chunks.append(seq.tokens_slice(done, seq.num_tokens))
            starts.append(done)
        drafts = [[t] for t in self._run(seqs, chunks, starts)]
        for i in range(1, max(ks)):
            live = [j for j, k in enumerate(ks) if k > i]
            nxt = self._run([seqs[j] for j in live], [[drafts[j][-1]] for j in live],
                            [seqs[j].num_tokens - 1 + i for j in live])
            for j, t in zip(live, nxt):
                drafts[j].append(t)
        for seq, k in zip(seqs, ks):
            self._computed[seq.seq_id] = (seq.num_preemptions, seq.num_tokens - 1 + k)  # tokens it wrote KV for
        return [d[:k] for d, k in zip(drafts, ks)]

    def verified(self, seq, num_new: int, k: int) -> None:
        """After verification: the draft KV stays valid where its inputs were the tokens accepted."""
        p = seq.num_computed_tokens  # before this step's advance
        self._computed[seq.seq_id] = (seq.num_preemptions, p + min(num_new - 1, k - 1) + 1)
