"""Synthetic token data, a pure function of (seed, step): every rank and the reference see the same batch.

Sequences follow a fixed random successor table with some noise, so the loss has something to learn.
"""
from __future__ import annotations

import torch

from ..spec import ModelSpec


def global_batch(m: ModelSpec, seed: int, step: int, sequences: int) -> torch.Tensor:
    """[sequences, seq_len + 1] token ids for one optimizer step (inputs are [:, :-1], targets [:, 1:])."""
    table = torch.randint(0, m.vocab, (m.vocab,), generator=torch.Generator().manual_seed(seed + 7919))
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    out = torch.empty(sequences, m.seq_len + 1, dtype=torch.long)
    out[:, 0] = torch.randint(0, m.vocab, (sequences,), generator=g)
    noise = torch.rand(sequences, m.seq_len, generator=g) < 0.2
    rand = torch.randint(0, m.vocab, (sequences, m.seq_len), generator=g)
    for i in range(m.seq_len):
        out[:, i + 1] = torch.where(noise[:, i], rand[:, i], table[out[:, i]])
    return out


def micro_batch(batch: torch.Tensor, replica: int, micro_batches: int, size: int, mb: int) -> torch.Tensor:
    """Replica d takes a contiguous slice of the global batch; micro-batch i a slice of that."""
    start = (replica * micro_batches + mb) * size
    return batch[start:start + size]


class Batches:
    """The rows of each step's global batch: synthetic (above) or drawn from a token file
    (`heteropp data prepare`), deterministically from (seed, step, row), so every rank asks only for its own
    rows and sees what the single-process reference sees."""

    def __init__(self, m: ModelSpec, seed: int, sequences: int, path: str | None = None) -> None:
        self.m, self.seed, self.sequences = m, seed, sequences
        self.tokens = None
        self._cached: tuple[int, torch.Tensor] | None = None  # synthetic: (step, its whole batch)
        if path:
            from ..data import TokenData
            self.tokens = TokenData.open(path, m.vocab)

    def rows(self, step: int, lo: int, hi: int) -> torch.Tensor:
        """Rows [lo, hi) of step `step`'s batch: [hi - lo, seq_len + 1] token ids."""
        if self.tokens is not None:
            return self.tokens.rows(self.seed, step, self.sequences, self.m.seq_len, lo, hi)
        if self._cached is None or self._cached[0] != step:  # every micro-batch of a step asks for its rows
            self._cached = (step, global_batch(self.m, self.seed, step, self.sequences))
        return self._cached[1][lo:hi]
