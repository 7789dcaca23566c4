"""all_gather, reduce_scatter, all_to_all and barrier across real processes (processes on one
host stand in for nodes): world sizes 2, 3 and 4, sizes on both sides of the direct/ring
thresholds, uneven and empty all_to_all splits, in-place use (a send buffer that is also a
receive buffer), and a barrier that must hold early ranks until a late one arrives. References are
computed by each rank from every rank's seeded input.
"""
from __future__ import annotations

import time

import pytest
import torch

from tests.dicomm.collectives_util import (TINY_THRESHOLDS, close_comm, describe_difference,
                                           inputs, open_comm, reference, same)
from tests.dicomm.multiproc import run_ranks

pytest.importorskip("dicomm._C")


def _exchange(rank, world, store, sizes, barrier_delay_s=None):
    comm = open_comm(rank, world, store)
    failures = []

    def check(what, got, expected):
        if not same(got, expected):
            failures.append(f"rank {rank}: {what}: {describe_difference(got, expected)}")

    for seed, n in enumerate(sizes):
        everyone = [inputs(seed, r, n, "int32", "sum") for r in range(world)]
        # all_gather into separate buffers, then in place inside one flat buffer
        slots = [torch.full((n,), -1, dtype=torch.int32) for _ in range(world)]
        comm.all_gather(everyone[rank].data_ptr(), n * 4, [s.data_ptr() for s in slots]).wait()
        for r in range(world):
            check(f"all_gather({n}) slot {r}", slots[r], everyone[r])
        flat = torch.full((world * n,), -1, dtype=torch.int32)
        flat[rank * n:(rank + 1) * n] = everyone[rank]
        comm.all_gather(flat[rank * n:].data_ptr(), n * 4,
                        [flat[r * n:].data_ptr() for r in range(world)]).wait()
        check(f"all_gather({n}) in place", flat, torch.cat(everyone))

        # reduce_scatter: block r of every rank's input goes to rank r, reduced
        for dtype, op in (("int32", "sum"), ("float64", "min"), ("bfloat16", "avg")):
            blocks = [[inputs(seed * 100 + b, r, n, dtype, op) for b in range(world)]
                      for r in range(world)]
            expected = reference([blocks[r][rank] for r in range(world)], dtype, op)
            out = torch.zeros(n, dtype=expected.dtype)
            comm.reduce_scatter([b.data_ptr() for b in blocks[rank]], out.data_ptr(), n, dtype,
                                op).wait()
            check(f"reduce_scatter({n} x {dtype}, {op})", out, expected)
            flat = torch.cat(blocks[rank])  # in place: the output is this rank's own block
            comm.reduce_scatter([flat[b * n:].data_ptr() for b in range(world)],
                                flat[rank * n:].data_ptr(), n, dtype, op).wait()
            check(f"reduce_scatter({n} x {dtype}, {op}) in place", flat[rank * n:(rank + 1) * n],
                  expected)

        # all_to_all with uneven (and some empty) splits: rank a sends size(a, b) to rank b
        def size(a, b, seed=seed, n=n):
            return ((a * 3 + b * 5 + seed) % 4) * (n // 3 + 1)

        def block(a, b, seed=seed, n=n, size=size):
            return inputs(seed * 7 + a * world + b, 0, size(a, b), "int32", "sum")

        sends = [block(rank, b) for b in range(world)]
        recvs = [torch.full((size(a, rank),), -1, dtype=torch.int32) for a in range(world)]
        comm.all_to_all([s.data_ptr() for s in sends], [s.numel() * 4 for s in sends],
                        [r.data_ptr() for r in recvs], [r.numel() * 4 for r in recvs]).wait()
        for a in range(world):
            check(f"all_to_all({n}) from {a}", recvs[a], block(a, rank))
        # in place with even splits: one buffer both sent from and received into
        flat = torch.cat([inputs(seed * 11 + rank * world + b, 0, n, "int32", "sum")
                          for b in range(world)])
        ptrs = [flat[b * n:].data_ptr() for b in range(world)]
        comm.all_to_all(ptrs, [n * 4] * world, ptrs, [n * 4] * world).wait()
        check(f"all_to_all({n}) in place", flat,
              torch.cat([inputs(seed * 11 + a * world + rank, 0, n, "int32", "sum")
                         for a in range(world)]))
    if barrier_delay_s is not None:
        # Ranks that enter the barrier early leave only after the late (last) rank enters. The
        # order is read on the host's monotonic clock, which every process shares: the late rank
        # stamps its entry, the others their exit (a stopwatch around an early rank's wait came
        # out short whenever that rank was preempted while the late one slept).
        comm.barrier().wait()
        if rank == world - 1:
            time.sleep(barrier_delay_s)
            store.set("late_rank_entered", repr(time.monotonic()))
        comm.barrier().wait()
        left = time.monotonic()
        entered = float(store.get("late_rank_entered"))
        if rank < world - 1 and left < entered:
            failures.append(f"rank {rank}: left the barrier {entered - left:.3f} s before the "
                            f"last rank entered it ({barrier_delay_s} s late)")
    close_comm(comm)
    return failures


@pytest.mark.parametrize("world", [2, 3, 4])
def test_exchange_default_thresholds(world):
    sizes = (0, 1, 9, 70_001)  # 70_001 x 4 B x world: past the 1 MiB all_gather ring threshold
    failures = sum(run_ranks(_exchange, world, sizes, 0.5, timeout=120), [])
    assert not failures, "\n".join(failures[:10])


@pytest.mark.parametrize("world", [2, 3, 4])
def test_exchange_large_message_algorithms(world):
    failures = sum(run_ranks(_exchange, world, (5, 67), timeout=120, env=TINY_THRESHOLDS), [])
    assert not failures, "\n".join(failures[:10])
