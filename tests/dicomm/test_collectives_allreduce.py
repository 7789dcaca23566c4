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
                                           describe_difference, inputs, open_comm, rank_order_inputs,
                                           rank_order_sum, reference, same, valid)
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


# The ring for every large all_reduce (the push algorithm is the default between ranks of one host).
RING = {"DICOMM_ALL_REDUCE_PUSH": "0"}


@pytest.mark.parametrize("world", [2, 3, 4])
def test_all_reduce_ring_on_every_dtype(world):
    """Tiny thresholds: the pipelined ring, many chunks and partial last chunks on every dtype
    and op, with counts that do not divide by the world size."""
    _assert_all_ok(run_ranks(_tiny_thresholds, world, timeout=120, env=dict(TINY_THRESHOLDS, **RING)))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_push_all_reduce_on_every_dtype(world):
    """The push algorithm (the default between ranks of one host) at tiny thresholds: many chunks and a
    partial last one on every dtype and op, counts that do not divide by the world size."""
    _assert_all_ok(run_ranks(_tiny_thresholds, world, timeout=120, env=TINY_THRESHOLDS))


def _one_rank_without_cross_memory_attach(rank, world, store):
    from dicomm import _C
    import torch.distributed as dist

    torch.set_num_threads(1)
    settings = {"DICOMM_SHM_CMA": "0"} if rank == 0 else {}  # rank 0 cannot reach its peers' memory
    comm = _C.Communicator(dist.PrefixStore("coll", store), rank, world, timeout_s=20.0, settings=settings)
    checked = _run_cases(comm, rank, world, _large_cases()[:3])
    close_comm(comm)
    return checked


@pytest.mark.parametrize("world", [2, 3])
def test_push_all_reduce_falls_back_together_when_one_rank_cannot_reach_the_others(world):
    """One rank without cross-memory attach: every rank takes the ring instead (deciding apart would hang
    or mix algorithms), and the results stay exact."""
    _assert_all_ok(run_ranks(_one_rank_without_cross_memory_attach, world, timeout=120))


# Above the 256 KiB threshold of a large all_reduce, several 512 KiB chunks and a partial last one, in
# counts that do not divide by the world size.
RANK_ORDER_SIZES = (300_007, 65_536 * 2 + 1)


def _rank_order_cases(rank, world, store):
    comm = open_comm(rank, world, store)
    out = []
    for i, numel in enumerate(RANK_ORDER_SIZES):
        for dtype, name, op in ((torch.float32, "float32", "sum"), (torch.float32, "float32", "avg"),
                                (torch.bfloat16, "bfloat16", "sum")):
            buf = rank_order_inputs(i, rank, numel, dtype)
            comm.all_reduce(buf.data_ptr(), numel, name, op).wait()
            out.append((i, numel, str(dtype), op, buf.float().numpy()))
    close_comm(comm)
    return out


# The direct algorithm for every large all_reduce of these world sizes (the default is the push algorithm
# on one host, the ring elsewhere).
DIRECT = {"DICOMM_ALL_REDUCE_DIRECT_RANKS": "8", "DICOMM_ALL_REDUCE_PUSH": "0"}


@pytest.mark.parametrize("world", [3, 4])
@pytest.mark.parametrize("algorithm,env", [("direct", DIRECT), ("push, the default on one host", {}),
                                           ("push, pairwise combines", {"DICOMM_ALL_REDUCE_FUSED": "0"})])
def test_large_all_reduce_reduces_every_element_in_rank_order(world, algorithm, env):
    """Random floats of different magnitudes (rounding depends on the order of the sum): a large
    all_reduce by the direct or the push algorithm (one fused pass over a chunk's inputs, the default, or
    a pairwise pass per peer) holds, on every rank, exactly torch's sequential sum
    x0 + x1 + ... in rank order in the same dtype (AVG: that sum divided by the world size), whichever
    rank reduced which block, from the communicator's first call on. The ring sums each block starting
    at a different rank."""
    results = run_ranks(_rank_order_cases, world, timeout=120, env=env)
    dtypes = {"torch.float32": torch.float32, "torch.bfloat16": torch.bfloat16}
    for case, (i, numel, dtype, op, _) in enumerate(results[0]):
        expected = rank_order_sum([rank_order_inputs(i, q, numel, dtypes[dtype]) for q in range(world)], op)
        for rank, res in enumerate(results):
            got = torch.from_numpy(res[case][4]).to(dtypes[dtype])
            bits = torch.int16 if dtype == "torch.bfloat16" else torch.int32
            wrong = got.view(bits) != expected.view(bits)
            assert not wrong.any(), (f"{algorithm}, rank {rank} of {world}: all_reduce({numel} x {dtype}, {op}) "
                                     f"differs from the rank-order sum at {int(wrong.sum())} elements, first at "
                                     f"{int(wrong.nonzero()[0])}")


@pytest.mark.parametrize("world", [2, 3, 4])
def test_direct_all_reduce_on_every_dtype(world):
    """The direct algorithm at tiny thresholds: many chunks and partial last chunks on every dtype and
    op, with counts that do not divide by the world size."""
    _assert_all_ok(run_ranks(_tiny_thresholds, world, timeout=120, env=dict(TINY_THRESHOLDS, **DIRECT)))
