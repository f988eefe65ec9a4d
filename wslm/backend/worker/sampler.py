"""Sampler: every request's own settings applied in one batched pass over the logits. It reads SampleRows
(engine/step_inputs.py), on whichever rank samples; a grammar reaches it as bitmask rows the engine filled."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from wslm.backend.engine.step_inputs import SampleRow
from wslm.backend.structured.mask import GrammarMasker
from wslm.backend.worker.token_rules import apply_token_rules


@dataclass(slots=True)
class SamplerOutput:
    token_ids: list[int]
    # Per row, only when asked: (sampled logprob, sampled rank, top ids, top logprobs), plus the ranks of
    # those ids when they are the request's logprob_token_ids rather than the top ones.
    logprobs: list[tuple | None]


def at_position(generator: torch.Generator, seed: int, position: int) -> torch.Generator:
    """A seeded request's generator, seeded for its output token at position: the noise it draws is a function
    of (seed, position) alone."""
    generator.manual_seed((seed * 0x9E3779B97F4A7C15 + position) % (1 << 64))
    return generator


def _seeded_draw(row: torch.Tensor, seq: SampleRow, ahead: int) -> None:
    """row := a seeded request's Exp(1) draws for its output token `ahead` positions past the next one."""
    row.exponential_(generator=at_position(seq.generator, seq.params.seed, seq.num_output_tokens + ahead))


class Sampler:
    def __init__(self, vocab_size: int, device: torch.device, seed: int = 0) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.grammar_masker = GrammarMasker(vocab_size)

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, seqs: list[SampleRow], grammar_bitmask=None) -> SamplerOutput:
        """seqs: a SampleRow per logits row; grammar_bitmask: (rows, bitmask) the engine filled from its
        grammar states (GrammarMasker.fill), or None."""
        params = [s.params for s in seqs]
        want_logprobs = [p.logprobs is not None for p in params]
        logits, raw_logprobs = self.process(logits, seqs, grammar_bitmask)
        greedy = [p.greedy for p in params]
        if all(greedy):
            tokens = logits.argmax(dim=-1)
        else:
            tokens = self._sample(logits, seqs, greedy)
        token_list = tokens.tolist()
        return SamplerOutput(token_list, self._logprobs(raw_logprobs, token_list, params, want_logprobs))

    def process(self, logits: torch.Tensor, seqs: list, grammar_bitmask=None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every request's logits processing (penalties, min_tokens, token rules, grammar): the logits to
        choose from, and the raw log-softmax when some row wants logprobs (speculative verification reuses it)."""
        logits = logits[:, : self.vocab_size].float()
        params = [s.params for s in seqs]
        raw_logprobs = torch.log_softmax(logits, dim=-1) if any(p.logprobs is not None for p in params) else None
        if any(p.has_penalties for p in params):
            logits = self._apply_penalties(logits.clone(), seqs)
        logits = self._block_early_stop(logits, seqs)
        logits = apply_token_rules(logits, seqs)
        if grammar_bitmask is not None:
            logits = self.grammar_masker.apply_bitmask(logits, *grammar_bitmask)
        return logits, raw_logprobs

    # ---- logits processing ----------------------------------------------------------------------
    def _apply_penalties(self, logits: torch.Tensor, seqs: list[SampleRow]) -> torch.Tensor:
        rows = len(seqs)
        dev = logits.device
        out_counts = torch.zeros(rows, self.vocab_size, device=dev)
        seen = torch.zeros(rows, self.vocab_size, dtype=torch.bool, device=dev)
        for i, seq in enumerate(seqs):
            if not seq.params.has_penalties:
                continue
            if seq.output_token_ids:
                ids = torch.tensor(seq.output_token_ids, device=dev)
                out_counts[i].index_add_(0, ids, torch.ones(len(ids), device=dev))
            if seq.params.repetition_penalty != 1.0:
                seen[i, torch.tensor(seq.token_ids(), device=dev)] = True
        rep = torch.tensor([s.params.repetition_penalty for s in seqs], device=dev).unsqueeze(1)
        pres = torch.tensor([s.params.presence_penalty for s in seqs], device=dev).unsqueeze(1)
        freq = torch.tensor([s.params.frequency_penalty for s in seqs], device=dev).unsqueeze(1)
        # Repetition penalty as in HF/vLLM: covers prompt and output tokens, divides positive logits.
        penalised = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(seen, penalised, logits)
        # OpenAI's presence/frequency penalties cover generated tokens only.
        return logits - freq * out_counts - pres * (out_counts > 0).float()

    def _block_early_stop(self, logits: torch.Tensor, seqs: list[SampleRow]) -> torch.Tensor:
        """While a request is below min_tokens, its EOS and stop tokens cannot be sampled."""
        cloned = False
        for i, seq in enumerate(seqs):
            p = seq.params
            if p.min_tokens and seq.num_output_tokens < p.min_tokens:
                banned = list(p.stop_token_ids or []) + ([] if p.ignore_eos else list(seq.eos_token_ids))
                banned = [t for t in banned if t < self.vocab_size]
                if banned:
                    if not cloned:
                        logits, cloned = logits.clone(), True
                    logits[i, banned] = float("-inf")
        return logits

    def _sample(self, logits: torch.Tensor, seqs: list[SampleRow], greedy: list[bool]) -> torch.Tensor:
        dev = logits.device
        greedy_tokens = logits.argmax(dim=-1)
        probs = self.probs(logits, [s.params for s in seqs], greedy)
        # Exponential race (Gumbel-max): argmax(p / E) with E ~ Exp(1) samples from p. A seeded request
        # draws its noise from its own generator, set for the token's position, so its tokens depend on
        # neither the rest of the batch nor how its earlier tokens were made (speculative runs or steps).
        noise = torch.empty_like(probs)
        noise.exponential_(generator=self.generator)
        for i, seq in enumerate(seqs):
            if seq.generator is not None and not greedy[i]:
                _seeded_draw(noise[i], seq, 0)
        sampled = (probs / noise).argmax(dim=-1)
        is_greedy = torch.tensor(greedy, device=dev)
        return torch.where(is_greedy, greedy_tokens, sampled)

    def noise(self, probs: torch.Tensor, seq: SampleRow) -> torch.Tensor:
        """Exp(1) draws for seq's next len(probs) positions, each row the one _sample would draw there (a
        speculative run's positions: spec_decode/verify.py)."""
        noise = torch.empty_like(probs)
        if seq.generator is None:
            return noise.exponential_(generator=self.generator)
        for i in range(noise.shape[0]):
            _seeded_draw(noise[i], seq, i)
        return noise

    def probs(self, logits: torch.Tensor, params: list, greedy: list[bool]) -> torch.Tensor:
        """The distribution each row samples from: temperature, top-k/top-p, min-p (unnormalized after min-p)."""
        dev = logits.device
        temps = torch.tensor([1.0 if g else p.temperature for p, g in zip(params, greedy)], device=dev)
        logits = logits / temps.unsqueeze(1)
        if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
            logits = self._top_k_top_p(logits, params)
        probs = torch.softmax(logits, dim=-1)
        if any(p.min_p > 0 for p in params):
            min_p = torch.tensor([p.min_p for p in params], device=dev).unsqueeze(1)
            probs = torch.where(probs < min_p * probs.max(dim=-1, keepdim=True).values, 0.0, probs)
        return probs

    def _top_k_top_p(self, logits: torch.Tensor, params) -> torch.Tensor:
        dev = logits.device
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        ks = torch.tensor([p.top_k if p.top_k > 0 else self.vocab_size for p in params], device=dev)
        ranks = torch.arange(self.vocab_size, device=dev).unsqueeze(0)
        mask = ranks >= ks.unsqueeze(1)
        top_p = torch.tensor([p.top_p for p in params], device=dev).unsqueeze(1)
        sorted_probs = torch.softmax(sorted_logits.masked_fill(mask, float("-inf")), dim=-1)
        # Drop a token once the mass before it already reaches top_p (the top token always stays).
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        mask |= mass_before >= top_p
        sorted_logits = sorted_logits.masked_fill(mask, float("-inf"))
        return torch.empty_like(logits).scatter_(1, order, sorted_logits)

    def _logprobs(self, raw, tokens, params, want) -> list:
        if raw is None:
            return [None] * len(tokens)
        result = []
        # -1: the whole vocabulary (allowed only when the server's --max-logprobs is -1).
        top_n = max(((self.vocab_size if p.logprobs == -1 else p.logprobs or 0) for p in params
                     if not p.logprob_token_ids), default=0)
        top_vals, top_ids = raw.topk(max(top_n, 1), dim=-1) if top_n else (None, None)
        chosen = raw.gather(1, torch.tensor(tokens, device=raw.device).unsqueeze(1)).squeeze(1)
        ranks = (raw > chosen.unsqueeze(1)).sum(dim=-1) + 1
        chosen_l, ranks_l = chosen.tolist(), ranks.tolist()
        for i, p in enumerate(params):
            if not want[i]:
                result.append(None)
                continue
            if p.logprob_token_ids:  # exactly these ids, with their true ranks
                wanted = torch.tensor(p.logprob_token_ids, device=raw.device)
                vals_t = raw[i, wanted]
                wanted_ranks = ((raw[i].unsqueeze(0) > vals_t.unsqueeze(1)).sum(dim=-1) + 1).tolist()
                result.append((chosen_l[i], ranks_l[i], list(p.logprob_token_ids), vals_t.tolist(), wanted_ranks))
                continue
            n = self.vocab_size if p.logprobs == -1 else p.logprobs or 0
            ids = top_ids[i, :n].tolist() if n else []
            vals = top_vals[i, :n].tolist() if n else []
            result.append((chosen_l[i], ranks_l[i], ids, vals))
        return result
