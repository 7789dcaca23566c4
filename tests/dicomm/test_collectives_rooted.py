"""Rooted collectives across real processes (processes on one host stand in for nodes):
broadcast, reduce, gather and scatter from every root, world sizes 2, 3 and 4, sizes from empty
to past the tree/chain and tree/ring thresholds. Each rank checks its result against what it
computes itself from every rank's seeded input (numpy references, never dicomm's kernels).
"""
from __future__ import annotations

import pytest
import torch

from tests.dicomm.collectives_util import (TINY_THRESHOLDS, close_comm, describe_difference,
                                           inputs, open_comm, reference, same)
from tests.dicomm.multiproc import run_ranks

pytest.importorskip("dicomm._C")

DEFAULT_SIZES = (0, 1, 13, 100_003)  # elements; 100_003 float32 > 256 KiB
TINY_SIZES = (3, 50, 257)  # with TINY_THRESHOLDS: chain, ring and many chunks


def _rooted(rank, world, store, sizes):
    comm = open_comm(rank, world, store)
    failures = []

    def check(what, got, expected):
        if not same(got, expected):
            failures.append(f"rank {rank}: {what}: {describe_difference(got, expected)}")

    for seed, n in enumerate(sizes):
        for root in range(world):
            everyone = [inputs(seed, r, n, "float32", "sum") for r in range(world)]

            buf = everyone[rank].clone() if rank == root else torch.full((n,), -1.0)
            comm.broadcast(buf.data_ptr(), buf.numel() * 4, root).wait()
            check(f"broadcast({n}, root {root})", buf, everyone[root])

            for dtype, op in (("float32", "sum"), ("int64", "max"), ("float16", "avg")):
                mine = inputs(seed, rank, n, dtype, op)
                buf = mine.clone()
                comm.reduce(buf.data_ptr(), n, dtype, op, root).wait()
                expected = reference([inputs(seed, r, n, dtype, op) for r in range(world)],
                                     dtype, op) if rank == root else mine  # others untouched
                check(f"reduce({n} x {dtype}, {op}, root {root})", buf, expected)

            slots = [torch.full((n,), -1.0) for _ in range(world)] if rank == root else []
            comm.gather(everyone[rank].data_ptr(), n * 4, [s.data_ptr() for s in slots],
                        root).wait()
            for r, s in enumerate(slots):
                check(f"gather({n}, root {root}) slot {r}", s, everyone[r])

            parts = [inputs(seed + 1000, r, n, "float32", "sum") for r in range(world)]
            sends = [p.data_ptr() for p in parts] if rank == root else []
            out = torch.full((n,), -1.0)
            comm.scatter(sends, out.data_ptr(), n * 4, root).wait()
            check(f"scatter({n}, root {root})", out, parts[rank])
    close_comm(comm)
    return failures


@pytest.mark.parametrize("world", [2, 3, 4])
def test_rooted_collectives_default_thresholds(world):
    failures = sum(run_ranks(_rooted, world, DEFAULT_SIZES, timeout=120), [])
    assert not failures, "\n".join(failures[:10])


@pytest.mark.parametrize("world", [2, 3, 4])
def test_rooted_collectives_large_message_algorithms(world):
    failures = sum(run_ranks(_rooted, world, TINY_SIZES, timeout=120, env=TINY_THRESHOLDS), [])
    assert not failures, "\n".join(failures[:10])


def _in_place_root(rank, world, store):
    """The root's own slot is its send buffer (gather) / its receive buffer (scatter)."""
    comm = open_comm(rank, world, store)
    n, root = 1000, world - 1
    flat = torch.full((world * n,), -1.0)
    mine = torch.arange(n, dtype=torch.float32) + 10_000 * rank
    if rank == root:
        flat[root * n:(root + 1) * n] = mine
        send = flat[root * n:].data_ptr()
        slots = [flat[r * n:].data_ptr() for r in range(world)]
    else:
        send, slots = mine.data_ptr(), []
    comm.gather(send, n * 4, slots, root).wait()
    gathered = flat.clone()
    out = flat[root * n:(root + 1) * n] if rank == root else torch.zeros(n)
    sends = [flat[r * n:].data_ptr() for r in range(world)] if rank == root else []
    comm.scatter(sends, out.data_ptr(), n * 4, root).wait()
    close_comm(comm)
    return gathered.numpy(), out.clone().numpy()


@pytest.mark.parametrize("world", [2, 3])
def test_root_buffers_may_alias(world):
    results = run_ranks(_in_place_root, world, timeout=60)
    n = 1000
    want = torch.cat([torch.arange(n, dtype=torch.float32) + 10_000 * r for r in range(world)])
    assert torch.equal(torch.from_numpy(results[-1][0]), want)
    for r, (_, out) in enumerate(results):
        assert torch.equal(torch.from_numpy(out), want[r * n:(r + 1) * n])
