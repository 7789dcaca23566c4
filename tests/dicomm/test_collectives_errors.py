"""Misuse of collectives across real processes (processes on one host stand in for nodes): ranks
that call different collectives, dtypes or sizes fail with MismatchError naming both calls and
nobody hangs past the (short) timeout or has memory written past its buffer; bad arguments fail
at once with ValueError naming the argument and leave the communicator usable; a failed
collective aborts the communicator, so later calls fail fast instead of mis-pairing messages.
"""
from __future__ import annotations

import time

import pytest
import torch

from tests.dicomm.collectives_util import close_comm, open_comm
from tests.dicomm.multiproc import run_ranks

_C = pytest.importorskip("dicomm._C")

TIMEOUT_S = 5.0
GUARD = 64  # elements after each buffer that must never be written


def _call(comm, spec, buf):
    kind, n, dtype = spec
    if kind == "all_reduce":
        return comm.all_reduce(buf.data_ptr(), n, dtype, "sum")
    if kind == "broadcast":
        return comm.broadcast(buf.data_ptr(), n * buf.element_size(), 0)
    if kind == "reduce":
        return comm.reduce(buf.data_ptr(), n, dtype, "sum", 0)
    if kind == "all_to_all":  # every rank sends n elements to each rank and expects n back
        world = comm.size
        size = n * buf.element_size()
        slots = [buf.data_ptr()] * world
        return comm.all_to_all(slots, [size] * world, slots, [size] * world)
    raise AssertionError(kind)


def _mismatch(rank, world, store, scenarios):
    """For each scenario, rank r runs specs[r] on a fresh communicator (a failed collective
    aborts its communicator); returns (error class, message, guard intact, seconds) per one."""
    outcomes = []
    for i, specs in enumerate(scenarios):
        comm = open_comm(rank, world, store, timeout_s=TIMEOUT_S, name=f"mismatch{i}")
        comm.barrier().wait()  # connections are up; what follows is only the mismatch
        kind, n, dtype = specs[rank]
        buf = torch.zeros(n + GUARD, dtype=getattr(torch, dtype))
        buf[n:] = 7
        start = time.monotonic()
        try:
            _call(comm, specs[rank], buf).wait()
            outcome = ("ok", "")
        except _C.DicommError as e:
            outcome = (type(e).__name__, str(e))
        elapsed = time.monotonic() - start
        comm.close()  # peers still waiting on this rank learn it is gone
        outcomes.append(outcome + (bool((buf[n:] == 7).all()), elapsed))
    return outcomes


def _assert_detected(results, needles):
    names = [r[0] for r in results]
    assert "ok" not in names, results  # every rank learns its collective failed
    # At least one rank sees the other's signature; a rank whose receive was too small for the
    # other's message may report the sizes instead (the engine checks sizes first).
    assert any(name == "MismatchError" and all(n in message for n in needles)
               for name, message, _, _ in results), results
    for _name, _message, guard_ok, elapsed in results:
        assert guard_ok, "a mismatched message was written past its buffer"
        assert elapsed < 3 * TIMEOUT_S, f"a rank waited {elapsed:.1f} s"


TWO_RANK_SCENARIOS = {
    "dtype": ([("all_reduce", 1024, "float32"), ("all_reduce", 1024, "int32")],
              ["all_reduce(1024 x float32, sum)", "all_reduce(1024 x int32, sum)"]),
    "count": ([("all_reduce", 1024, "float32"), ("all_reduce", 2048, "float32")],
              ["all_reduce(1024 x float32, sum)", "all_reduce(2048 x float32, sum)"]),
    # sizes on both sides of the ring threshold: the two algorithms still meet on step 0
    "algorithm": ([("all_reduce", 100, "float32"), ("all_reduce", 300_000, "float32")],
                  ["all_reduce(100 x float32, sum)", "all_reduce(300000 x float32, sum)"]),
    "collective": ([("all_reduce", 256, "float32"), ("broadcast", 256, "float32")],
                   ["all_reduce(256 x float32, sum)", "broadcast(1024 B, root 0)"]),
    "rooted": ([("reduce", 64, "int64"), ("all_reduce", 64, "int64")],
               ["reduce(64 x int64, sum, root 0)", "all_reduce(64 x int64, sum)"]),
    "all_to_all": ([("all_to_all", 10, "int32"), ("all_to_all", 12, "int32")],
                   ["all_to_all(40 B for this pair)", "all_to_all(48 B for this pair)"]),
}


def test_two_ranks_disagree():
    names = list(TWO_RANK_SCENARIOS)
    results = run_ranks(_mismatch, 2, [TWO_RANK_SCENARIOS[n][0] for n in names], timeout=90)
    for i, name in enumerate(names):
        _assert_detected([per_rank[i] for per_rank in results], TWO_RANK_SCENARIOS[name][1])


@pytest.mark.parametrize("world", [3, 4])
def test_one_rank_of_many_disagrees(world):
    specs = [("all_reduce", 500, "float32")] * (world - 1) + [("all_reduce", 500, "float64")]
    results = run_ranks(_mismatch, world, [specs], timeout=60)
    _assert_detected([per_rank[0] for per_rank in results],
                     ["all_reduce(500 x float64, sum)", "all_reduce(500 x float32, sum)"])


def _bad_arguments(rank, world, store):
    comm = open_comm(rank, world, store, timeout_s=TIMEOUT_S)
    x = torch.zeros(8)
    p = x.data_ptr()
    errors = {}

    def expect(name, fn):
        try:
            fn()
            errors[name] = "no error"
        except ValueError as e:  # dicomm's ValueError is a Python ValueError
            errors[name] = str(e)

    expect("broadcast root", lambda: comm.broadcast(p, 32, world))
    expect("reduce root", lambda: comm.reduce(p, 8, "float32", "sum", -1))
    expect("gather root", lambda: comm.gather(p, 32, [p] * world, world + 3))
    expect("scatter root", lambda: comm.scatter([p] * world, p, 32, -2))
    expect("all_gather list", lambda: comm.all_gather(p, 32, [p] * (world + 1)))
    expect("gather non-root list", lambda: comm.gather(p, 32, [p] * world, 1 - rank % 2)
           if rank != (1 - rank % 2) else comm.gather(p, 32, [p], rank))
    expect("reduce_scatter list", lambda: comm.reduce_scatter([p], p, 1, "float32", "sum"))
    expect("all_to_all sizes", lambda: comm.all_to_all([p] * world, [4] * (world - 1),
                                                      [p] * world, [4] * world))
    expect("bitwise float", lambda: comm.all_reduce(p, 8, "bfloat16", "bxor"))
    expect("avg bool", lambda: comm.all_reduce(p, 8, "bool", "avg"))
    expect("dtype name", lambda: comm.all_reduce(p, 8, "float8", "sum"))
    # Nothing above reached the wire: the communicator still works.
    y = torch.full((8,), float(rank + 1))
    comm.all_reduce(y.data_ptr(), 8, "float32", "sum").wait()
    close_comm(comm)
    return errors, y.tolist()


def test_bad_arguments_raise_value_error_naming_them():
    world = 2
    results = run_ranks(_bad_arguments, world, timeout=60)
    needles = {
        "broadcast root": "root 2", "reduce root": "root -1", "gather root": "root 5",
        "scatter root": "root -2", "all_gather list": "recv_ptrs has 3 entries",
        "gather non-root list": "recv_ptrs", "reduce_scatter list": "send_ptrs has 1 entries",
        "all_to_all sizes": "send_nbytes has 1 entries", "bitwise float": "'bxor'",
        "avg bool": "'avg'", "dtype name": "unknown dtype 'float8'",
    }
    for errors, total in results:
        for name, needle in needles.items():
            assert needle in errors[name], f"{name}: {errors[name]}"
        assert "bfloat16" in errors["bitwise float"] and "bool" in errors["avg bool"]
        assert total == [3.0] * 8


# Long enough that waiting it out cannot pass for failing at once on a loaded host.
AFTER_FAILURE_TIMEOUT_S = 60.0


def _after_failure(rank, world, store):
    comm = open_comm(rank, world, store, timeout_s=AFTER_FAILURE_TIMEOUT_S)
    comm.barrier().wait()
    buf = torch.zeros(16, dtype=torch.float32 if rank == 0 else torch.float64)
    first = second = "ok"
    try:
        comm.all_reduce(buf.data_ptr(), 16, "float32" if rank == 0 else "float64", "sum").wait()
    except _C.DicommError as e:
        first = type(e).__name__
    start = time.monotonic()
    try:
        comm.barrier().wait()
    except _C.DicommError as e:
        second = f"{type(e).__name__}: {e}"
    elapsed = time.monotonic() - start
    comm.close()
    return first, second, elapsed


def test_failed_collective_aborts_the_communicator():
    for first, second, elapsed in run_ranks(_after_failure, 2, timeout=60):
        assert first == "MismatchError"
        assert second.startswith("PeerError") and "aborted" in second, second
        # fails at once rather than waiting for the timeout (a bound no preemption reaches)
        assert elapsed < AFTER_FAILURE_TIMEOUT_S / 4, f"the barrier took {elapsed:.1f} s to fail"
