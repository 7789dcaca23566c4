"""Helpers for the engine tests: communicators on the harness store, reference payloads."""
from __future__ import annotations

import numpy as np

SIZES = [0, 1, 8, 4095, 16384, 16385, 65536, 65537, 1 << 20, (3 << 20) + 7, 64 << 20]


def comm(store, rank: int, size: int, timeout_s: float = 30.0, transport: str = "auto"):
    import dicomm._C as C

    return C.Communicator(store, rank, size, timeout_s, transport)


def payload(n: int, seed: int) -> np.ndarray:
    """Deterministic bytes the receiver can regenerate independently of the transfer."""
    return np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8)


def ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def exchange(c, rank: int) -> bool:
    """One 8-byte message each way between ranks 0 and 1; True if both arrived intact."""
    mine, theirs = np.array([rank + 40], np.int64), np.zeros(1, np.int64)
    r = c.irecv(ptr(theirs), 8, 1 - rank, tag=1)
    c.isend(ptr(mine), 8, 1 - rank, tag=1).wait()
    r.wait()
    return int(theirs[0]) == 1 - rank + 40


def close_pair(c, store, rank: int, key: str = "done") -> None:
    """Closes a two-rank test's communicator once the other rank is done with it too."""
    store.set(f"{key}{rank}", "1")
    store.wait([f"{key}{1 - rank}"])
    c.close()
