"""all_reduce across real processes (processes on one host stand in for nodes): every dtype x
every op, world sizes 2, 3 and 4 (3: not a power of two), sizes on both sides of the algorithm
thresholds (recursive doubling below, pipelined ring above) and counts that do not divide by the
world size. Each rank checks its result against a reference it computes itself from every rank's
seeded input (numpy in float64 / modulo 2**64), never through dicomm's kernels.
"""
from __future__ import annotations

import hashlib

import pytest
import torch

from tests.dicomm.collectives_util import (DTYPES, OPS, TINY_THRESHOLDS, close_comm,
                                           describe_difference, inputs, open_comm, reference,
                                           same, valid)
from tests.dicomm.multiproc import run_ranks

pytest.importorskip("dicomm._C")


def _run_cases(comm, rank, world, cases):
    failures, digests = [], []
    for seed, dtype, op, numel in cases:
        buf = inputs(seed, rank, numel, dtype, op)
        expected = reference([inputs(seed, r, numel, dtype, op) for r in range(world)], dtype, op)
        comm.all_reduce(buf.data_ptr(), numel, dtype, op).wait()
        if not same(buf, expected):
            failures.append(f"rank {rank}: all_reduce({numel} x {dtype}, {op}) "
                            f"{describe_difference(buf, expected)}")
        digests.append(hashlib.sha1(buf.view(torch.uint8).numpy().tobytes()).hexdigest())
    return failures, digests


def _assert_all_ok(results):
    failures = [f for fs, _ in results for f in fs]
    assert not failures, "\n".join(failures[:10])
    # Every rank must hold the very same bytes, not merely close values.
    assert all(d == results[0][1] for _, d in results)


def _matrix(sizes):
    """Every dtype x every valid op x `sizes`, each case with its own seed."""
    return [(i, d, op, n) for i, (d, op, n) in enumerate(
        (d, op, n) for d in DTYPES for op in OPS if valid(d, op) for n in sizes)]


def _large_cases():
    """Real sizes: under and over the 256 KiB ring threshold, up to several 512 KiB chunks."""
    pairs = [("float32", "sum"), ("float32", "avg"), ("float32", "max"), ("int32", "sum"),
             ("bfloat16", "avg")]
    return [(1000 + i, d, op, n) for i, (d, op, n) in enumerate(
        (d, op, n) for d, op in pairs for n in (65_535, 65_536 * 2 + 1, 300_007))]


INEXACT_SIZES = (33, 200_001)  # recursive doubling, ring


def _inexact_and_nan(comm, rank, world):
    """Random floats (inexact sums) and a NaN on one rank, for both algorithms."""
    out = []
    for n in INEXACT_SIZES:
        x = torch.randn(n, generator=torch.Generator().manual_seed(rank), dtype=torch.float32)
        comm.all_reduce(x.data_ptr(), n, "float32", "sum").wait()
        y = torch.arange(n, dtype=torch.float32)
        if rank == world - 1:
            y[n // 2] = float("nan")
        comm.all_reduce(y.data_ptr(), n, "float32", "max").wait()
        out.append((x.numpy(), y.numpy()))  # numpy: tensors would cross the queue as shared fds
    return out


def _default_thresholds(rank, world, store):
    comm = open_comm(rank, world, store)
    checked = _run_cases(comm, rank, world, _matrix((0, 1, 5, 37)) + _large_cases())
    inexact = _inexact_and_nan(comm, rank, world)
    close_comm(comm)
    return checked, inexact


def _tiny_thresholds(rank, world, store):
    comm = open_comm(rank, world, store)
    checked = _run_cases(comm, rank, world, _matrix((3, 101)))
    close_comm(comm)
    return checked


@pytest.mark.parametrize("world", [2, 3, 4])
def test_all_reduce_default_thresholds(world):
    """The full dtype x op matrix at small sizes (recursive doubling), real sizes across the ring
    threshold, and inexact float sums that every rank must hold bit-for-bit identically."""
    results = run_ranks(_default_thresholds, world, timeout=120)
    _assert_all_ok([checked for checked, _ in results])
    for k, n in enumerate(INEXACT_SIZES):
        sums = [torch.from_numpy(inexact[k][0]) for _, inexact in results]
        exact = sum(torch.randn(n, generator=torch.Generator().manual_seed(q),
                                dtype=torch.float32).double() for q in range(world))
        # float32 sums of `world` N(0,1) values: each rounding errs by <= 2^-24 relative to a
        # partial sum, so 1e-5 absolute is a loose bound.
        assert torch.allclose(sums[0].double(), exact, rtol=0, atol=1e-5)
        assert all(torch.equal(s, sums[0]) for s in sums), "ranks disagree bit-for-bit"
        for _, inexact in results:
            m = torch.from_numpy(inexact[k][1])
            assert torch.isnan(m[n // 2]) and not torch.isnan(m[: n // 2]).any()
            assert torch.equal(m[: n // 2], torch.arange(n // 2, dtype=torch.float32))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_all_reduce_ring_on_every_dtype(world):
    """Tiny thresholds: the pipelined ring, many chunks and partial last chunks on every dtype
    and op, with counts that do not divide by the world size."""
    _assert_all_ok(run_ranks(_tiny_thresholds, world, timeout=120, env=TINY_THRESHOLDS))
