"""Soak: thousands of randomly sized point-to-point and collective operations across 4 ranks.

Processes on one host stand in for nodes; CPU tensors stand in for device tensors. Every rank
draws the same operation sequence from a shared seed; payloads are a pure function of (operation,
rank), so each rank recomputes what it should have received and compares every byte (a CRC-32 of
the received bytes against the expected one, and exact tensor equality). Several operations are
kept in flight at once. DICOMM_SOAK_OPS makes it longer (default 2000).
"""
from __future__ import annotations

import os
import random
import zlib

import torch
import torch.distributed as dist

from tests.dicomm.multiproc import init_process_group, run_ranks

WS = 4
OPS = int(os.environ.get("DICOMM_SOAK_OPS", "2000"))
WINDOW = 8  # point-to-point operations in flight before waiting


def _payload(op: int, rank: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(op * 131 + rank)
    return torch.randint(-1000, 1000, (n,), dtype=torch.int32, generator=g)


def _size(rnd: random.Random) -> int:
    """Mostly small, sometimes large (up to 1 MiB of int32): crosses the engine's size paths
    (eager slots, rendezvous, chunked streaming, collective algorithm switches)."""
    if rnd.random() < 0.05:
        return rnd.choice([16384, 65536, 262144]) + rnd.randrange(3)
    return rnd.choice([0, 1, 2, 7, 64, 1000, 4096]) + rnd.randrange(3)


def _crc(t: torch.Tensor) -> int:
    return zlib.crc32(t.numpy().tobytes())


class _Checker:
    def __init__(self) -> None:
        self.pending: list[tuple[object, torch.Tensor, torch.Tensor, str]] = []
        self.checked_bytes = 0

    def expect(self, work, got: torch.Tensor, want: torch.Tensor, what: str) -> None:
        self.pending.append((work, got, want, what))
        if len(self.pending) >= WINDOW:
            self.drain()

    def drain(self) -> None:
        for work, got, want, what in self.pending:
            if work is not None:
                work.wait()
            if want is not None:
                assert _crc(got) == _crc(want) and torch.equal(got, want), f"{what}: corrupted"
                self.checked_bytes += got.nbytes
        self.pending.clear()


def _one_op(i: int, rnd: random.Random, rank: int, chk: _Checker) -> None:
    kind = rnd.choice(["p2p"] * 6 + ["all_reduce", "all_gather", "broadcast", "reduce_scatter",
                                     "all_to_all"])
    n = _size(rnd)
    if kind == "p2p":
        src, dst = rnd.sample(range(WS), 2)
        tag = rnd.randrange(4)
        if rank == src:
            chk.expect(dist.isend(_payload(i, src, n), dst, tag=tag), None, None, "")
        elif rank == dst:
            got = torch.empty(n, dtype=torch.int32)
            chk.expect(dist.irecv(got, src, tag=tag), got, _payload(i, src, n),
                       f"op {i}: {n} x int32 from {src}")
        return
    chk.drain()  # collectives wait for the point-to-point window (ranks may be in either)
    if kind == "all_reduce":
        t = _payload(i, rank, n)
        dist.all_reduce(t)
        want = sum(_payload(i, r, n) for r in range(WS))
    elif kind == "all_gather":
        t = torch.empty(WS * n, dtype=torch.int32)
        dist.all_gather_single(t, _payload(i, rank, n))
        want = torch.cat([_payload(i, r, n) for r in range(WS)])
    elif kind == "broadcast":
        root = rnd.randrange(WS)
        t = _payload(i, rank, n)
        dist.broadcast(t, root)
        want = _payload(i, root, n)
    elif kind == "reduce_scatter":
        t = torch.empty(n, dtype=torch.int32)
        dist.reduce_scatter_single(t, _payload(i, rank, WS * n))
        want = sum(_payload(i, r, WS * n) for r in range(WS))[rank * n:(rank + 1) * n]
    else:
        splits = [[rnd.randrange(0, 300) for _ in range(WS)] for _ in range(WS)]  # [src][dst]
        send = _payload(i, rank, sum(splits[rank]))
        t = torch.empty(sum(s[rank] for s in splits), dtype=torch.int32)
        dist.all_to_all_single(t, send, [s[rank] for s in splits], splits[rank])
        want = torch.cat([_payload(i, r, sum(splits[r])).split(splits[r])[rank] for r in range(WS)])
    chk.expect(None, t, want, f"op {i}: {kind} of {n}")


def _soak(rank: int, ws: int, store, backend: str, ops: int) -> tuple[int, int]:
    if backend == "dicomm":
        import dicomm  # noqa: F401
    init_process_group(backend, rank, ws, store, timeout_s=60)
    rnd = random.Random(20240611)
    chk = _Checker()
    for i in range(ops):
        _one_op(i, rnd, rank, chk)
    chk.drain()
    dist.barrier()
    dist.destroy_process_group()
    return ops, chk.checked_bytes


def test_soak_every_byte_verified():
    out = run_ranks(_soak, WS, "dicomm", OPS, timeout=max(120, OPS / 10))
    assert all(ops == OPS for ops, _ in out)
    assert sum(b for _, b in out) > 0
