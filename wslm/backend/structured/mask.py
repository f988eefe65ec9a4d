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
        self._apply([row for row, _ in rows], bitmask, logits)

    def fill(self, rows: list[tuple[int, Any]]) -> torch.Tensor:
        """The bitmask rows of these grammar states (for a sampler in another process: apply_bitmask)."""
        import xgrammar as xgr

        bitmask = xgr.allocate_token_bitmask(len(rows), self.vocab_size)
        for i, (_, state) in enumerate(rows):
            state.fill_mask(bitmask, i)
        return bitmask

    def apply_bitmask(self, logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> torch.Tensor:
        """fill()'s bitmask (row i for logits row rows[i]) applied; returns the logits (dense, in place)."""
        if not rows:
            return logits
        logits = logits.contiguous()
        full = torch.full((logits.shape[0], bitmask.shape[1]), -1, dtype=bitmask.dtype)  # -1: all allowed
        full[rows] = bitmask
        self._apply(rows, full, logits)
        return logits

    def _apply(self, indices: list[int], bitmask: torch.Tensor, logits: torch.Tensor) -> None:
        import xgrammar as xgr

        if logits.device.type != "cpu":
            bitmask = bitmask.to(logits.device, non_blocking=True)
        xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=self.vocab_size, indices=indices)
