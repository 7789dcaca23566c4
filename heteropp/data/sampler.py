"""Which windows a step draws: a pure function of (seed, step, row), so every rank computes its own rows
without talking to the others and the single-process reference computes the same batch.

As in Megatron-LM's GPT dataset, the token stream is cut into windows of seq_len + 1 tokens that start every
seq_len tokens (window w is tokens [w * seq_len, w * seq_len + seq_len + 1); consecutive windows share one
token), and each epoch visits all windows in an order shuffled from (seed, epoch). Megatron keeps that order
in a shuffle-index array; here it is a keyed permutation (a Feistel network over the next power of four with
cycle walking) evaluated per sample, so a rank's cost is its own rows, not the epoch's length.
"""
from __future__ import annotations

import numpy as np

_M64 = (1 << 64) - 1
_ROUNDS = 6


def windows(num_tokens: int, seq_len: int) -> int:
    """Windows of seq_len + 1 tokens, advancing by seq_len, in a stream of `num_tokens` tokens."""
    return max(0, (num_tokens - 1) // seq_len)


def _mix_int(x: int) -> int:
    """splitmix64's finalizer on a Python int (for the round keys)."""
    x &= _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _mix(x: np.ndarray) -> np.ndarray:
    """The same finalizer on a uint64 array (multiplication wraps modulo 2**64)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    out: np.ndarray = x ^ (x >> np.uint64(31))
    return out


def _round_keys(seed: int, epoch: int) -> list[np.uint64]:
    base = _mix_int(_mix_int(seed & _M64) ^ (epoch * 0x9E3779B97F4A7C15))
    return [np.uint64(_mix_int(base + r + 1)) for r in range(_ROUNDS)]


def permute(positions: np.ndarray, n: int, seed: int, epoch: int) -> np.ndarray:
    """The window at each of `positions` (each in [0, n)) in epoch `epoch`'s order: a bijection of range(n)
    that depends on (seed, epoch) only."""
    half = max(1, ((n - 1).bit_length() + 1) // 2)  # 4**half >= n
    mask, shift = np.uint64((1 << half) - 1), np.uint64(half)
    keys = _round_keys(seed, epoch)

    def enc(x: np.ndarray) -> np.ndarray:
        left, right = x >> shift, x & mask
        for k in keys:
            left, right = right, left ^ (_mix(right ^ k) & mask)
        out: np.ndarray = (left << shift) | right
        return out

    y = enc(np.asarray(positions, dtype=np.uint64))
    # Cycle walking: re-encrypt what lands outside [0, n); the cycle through x < n returns below n.
    out = y >= np.uint64(n)
    while out.any():
        y[out] = enc(y[out])
        out = y >= np.uint64(n)
    return y.astype(np.int64)


def sample_windows(seed: int, step: int, sequences: int, lo: int, hi: int, n: int) -> np.ndarray:
    """Window indices of rows [lo, hi) of step `step` (from 1) in a batch of `sequences` rows, over n windows
    per epoch. Row r is global sample g = (step - 1) * sequences + r, in epoch g // n at position g % n."""
    if step < 1:
        raise ValueError(f"step counts from 1, got {step}")
    if not 0 <= lo <= hi <= sequences:
        raise ValueError(f"rows [{lo}, {hi}) are not within a batch of {sequences}")
    if n < 1:
        raise ValueError(f"no windows to draw from (n = {n})")
    g = (step - 1) * sequences + np.arange(lo, hi, dtype=np.int64)
    epoch, pos = g // n, g % n
    out = np.empty(hi - lo, dtype=np.int64)
    for e in np.unique(epoch).tolist():
        sel = epoch == e
        out[sel] = permute(pos[sel], n, seed, int(e))
    return out
