"""Work stealing in the push all_reduce (DICOMM_ALL_REDUCE_STEAL=1; off by default): a rank left
behind (here one that waits on purpose, DICOMM_ALL_REDUCE_PUSH_DELAY_MS, as a descheduled rank would)
has its block reduced by the others, which the communicator's "all_reduce_chunks_stolen" counter
shows, and every element is still the rank-order sum, bit for bit, whoever reduced it. References:
torch's sequential sum in rank order, and the exact float64 / modulo-2**64 reference of
collectives_util (never dicomm's kernels).

Processes on one host stand in for nodes; the shared-memory transport stands in for the network.
"""
from __future__ import annotations

import pytest
import torch

from tests.dicomm.collectives_util import (DTYPES, OPS, TINY_THRESHOLDS, close_comm, describe_difference,
                                           inputs, rank_order_inputs, rank_order_sum, reference, same, valid)
from tests.dicomm.multiproc import run_ranks

pytest.importorskip("dicomm._C")

LATE_RANK = 1
NUMEL = 1_000_003  # 4 MiB of float32: several 512 KiB chunks per block, a count no world size divides
CALLS = 2


def _open(rank, world, store, delay_ms, settings):
    import torch.distributed as dist
    from dicomm import _C

    torch.set_num_threads(1)
    settings = {"DICOMM_ALL_REDUCE_STEAL": "1", **settings}
    if rank == LATE_RANK:
        settings["DICOMM_ALL_REDUCE_PUSH_DELAY_MS"] = str(delay_ms)
    return _C.Communicator(dist.PrefixStore("steal", store), rank, world, timeout_s=30.0, settings=settings)


def _late_rank(rank, world, store, settings):
    comm = _open(rank, world, store, 300, settings)
    out = []
    for call in range(CALLS):
        for dtype, name, op in ((torch.float32, "float32", "sum"), (torch.bfloat16, "bfloat16", "avg")):
            buf = rank_order_inputs(call, rank, NUMEL, dtype)
            comm.all_reduce(buf.data_ptr(), NUMEL, name, op).wait()
            out.append((call, str(dtype), op, buf.view(torch.int16 if name == "bfloat16" else torch.int32).numpy()))
    stolen = comm.stats()["all_reduce_chunks_stolen"]
    close_comm(comm)
    return stolen, out


def _check_rank_order(results, world):
    dtypes = {"torch.float32": torch.float32, "torch.bfloat16": torch.bfloat16}
    for case, (call, dtype, op, _) in enumerate(results[0][1]):
        expected = rank_order_sum([rank_order_inputs(call, q, NUMEL, dtypes[dtype]) for q in range(world)], op)
        bits = expected.view(torch.int16 if dtype == "torch.bfloat16" else torch.int32)
        for rank, (_, out) in enumerate(results):
            wrong = torch.from_numpy(out[case][3]) != bits
            assert not wrong.any(), (f"rank {rank} of {world}, call {call}: all_reduce({NUMEL} x {dtype}, {op}) "
                                     f"differs from the rank-order sum at {int(wrong.sum())} elements")


@pytest.mark.parametrize("world", [3, 4])
def test_ranks_done_with_their_block_reduce_a_late_ranks_chunks(world):
    """Rank 1 waits 300 ms after the address exchange in every call: the others, done with their own
    blocks, reduce its chunks (counted), and every rank holds torch's rank-order sum bit for bit."""
    results = run_ranks(_late_rank, world, {}, timeout=120)
    stolen = [s for s, _ in results]
    assert sum(s for q, s in enumerate(stolen) if q != LATE_RANK) > 0, f"chunks stolen per rank: {stolen}"
    _check_rank_order(results, world)


def test_without_stealing_the_late_rank_reduces_its_own_block():
    """DICOMM_ALL_REDUCE_STEAL=0 (the default): nobody steals, the late rank reduces its own block, and
    the result is the same rank-order sum."""
    results = run_ranks(_late_rank, 3, {"DICOMM_ALL_REDUCE_STEAL": "0"}, timeout=120)
    assert [s for s, _ in results] == [0, 0, 0]
    _check_rank_order(results, 3)


def _every_dtype_with_a_late_rank(rank, world, store):
    comm = _open(rank, world, store, 20, TINY_THRESHOLDS)
    failures = []
    for i, (dtype, op) in enumerate((d, op) for d in DTYPES for op in OPS if valid(d, op)):
        numel = 101
        buf = inputs(i, rank, numel, dtype, op)
        expected = reference([inputs(i, q, numel, dtype, op) for q in range(world)], dtype, op)
        comm.all_reduce(buf.data_ptr(), numel, dtype, op).wait()
        if not same(buf, expected):
            failures.append(f"rank {rank}: all_reduce({numel} x {dtype}, {op}) {describe_difference(buf, expected)}")
    stolen = comm.stats()["all_reduce_chunks_stolen"]
    close_comm(comm)
    return stolen, failures


@pytest.mark.parametrize("world", [2, 4])
def test_stolen_chunks_hold_the_exact_result_on_every_dtype_and_op(world):
    """Tiny thresholds (many chunks of a few elements) and a rank 20 ms late in every call: chunks
    reduced by thieves hold the exact result on every dtype and op."""
    results = run_ranks(_every_dtype_with_a_late_rank, world, timeout=120)
    failures = [f for _, fs in results for f in fs]
    assert not failures, "\n".join(failures[:10])
    stolen = [s for s, _ in results]
    assert sum(s for q, s in enumerate(stolen) if q != LATE_RANK) > 0, f"chunks stolen per rank: {stolen}"


def _late_rank_dies(rank, world, store):
    import os
    import signal
    import threading

    comm = _open(rank, world, store, 2000, {})
    buf = rank_order_inputs(0, rank, NUMEL, torch.float32)
    comm.all_reduce(buf.data_ptr(), NUMEL, "float32", "sum").wait()  # stealing set up: claim words mapped
    if rank == LATE_RANK:  # killed in its wait, while the others take its chunks
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGKILL)).start()
    try:
        comm.all_reduce(buf.data_ptr(), NUMEL, "float32", "sum").wait()
    except Exception as e:  # noqa: BLE001 - the error is the result
        return type(e).__name__, str(e)
    return "returned", ""


def test_survivors_raise_when_the_late_rank_dies_mid_call():
    """Rank 1 is SIGKILLed while the others steal its chunks: they raise an error naming it (the call
    cannot complete: its buffer is gone), not hang and not return."""
    results = run_ranks(_late_rank_dies, 3, timeout=90, expect_dead=[LATE_RANK])
    for rank, result in enumerate(results):
        if rank == LATE_RANK:
            continue
        kind, text = result
        assert kind != "returned" and "rank 1" in text, f"rank {rank}: {kind}: {text}"
