"""The batched sampler's grammar step: one bitmask row per constrained request, applied in place."""

from __future__ import annotations

from typing import Any

import torch


class GrammarMasker:
    """Keeps one bitmask buffer (grown as needed) so that a step allocates nothing."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._bitmask: torch.Tensor | None = None

    def apply(self, logits: torch.Tensor, rows: list[tuple[int, Any]]) -> None:
        """rows: (logits row, GrammarState) for the constrained requests; the others are left alone.
        Tokens the grammar forbids get -inf."""
        import xgrammar as xgr

        batch = logits.shape[0]
        if self._bitmask is None or self._bitmask.shape[0] < batch:
            self._bitmask = xgr.allocate_token_bitmask(max(batch, 8), self.vocab_size)
        bitmask = self._bitmask[:batch]
        for row, state in rows:
            state.fill_mask(bitmask, row)
        indices = [row for row, _ in rows]
        if logits.device.type != "cpu":
            bitmask = bitmask.to(logits.device, non_blocking=True)
        xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=self.vocab_size, indices=indices)
