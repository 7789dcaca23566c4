"""Coalescing (NCCL's contract, which gloo lacks): between the backend's startCoalescing and
endCoalescing every operation is issued as usual, and endCoalescing returns one work for the batch.
torch takes that path for `batch_isend_irecv` when the backend supports coalescing and for
`_coalescing_manager(device=...)`. Before, dicomm failed the latter ("does not implement
startCoalescing"), as gloo does.

The reference is gloo running the same operations without the device (torch's Python-side
coalescing, or one by one). Real processes, 2 ranks on CPU, one host.
"""
from __future__ import annotations

import traceback

import pytest
import torch
import torch.distributed as dist

from tests.dicomm.backend_testlib import assert_same_results, make_input, pack, run_unpacked
from tests.dicomm.multiproc import init_process_group

CPU = torch.device("cpu")


def _batches(rank: int, ws: int, store, backend: str) -> dict:
    init_process_group(backend, rank, ws, store, timeout_s=60)
    device = CPU if backend == "dicomm" else None  # gloo cannot coalesce in the backend
    out: dict = {}
    try:
        send = make_input("ring", rank, (5,))
        recv = torch.empty(5)
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % ws),
               dist.P2POp(dist.irecv, recv, (rank - 1) % ws)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        out["ring"] = recv

        a, b = make_input("a", rank, (3,)), make_input("b", rank, (4,))  # one dtype: gloo needs it
        with dist._coalescing_manager(device=device, async_ops=True) as cm:
            dist.all_reduce(a)
            dist.all_reduce(b)
        cm.wait()
        out["all_reduce"] = [a, b]

        # Different kinds in one batch (torch issues them one by one; the batch's work waits
        # for all): a broadcast, an all_gather and a point-to-point exchange.
        x = make_input("x", rank, (6,))
        gathered = [torch.empty(2) for _ in range(ws)]
        peer_in = torch.empty(3)
        with dist._coalescing_manager(device=device, async_ops=True) as cm:
            works = [dist.broadcast(x, 1, async_op=True),
                     dist.all_gather(gathered, make_input("g", rank, (2,)), async_op=True),
                     dist.isend(make_input("p", rank, (3,)), 1 - rank),
                     dist.irecv(peer_in, 1 - rank)]
        cm.wait()
        if backend == "gloo":
            for w in works:
                w.wait()
        out["mixed"] = [x, *gathered, peer_in]
        out["batch works"] = len(cm.works)
    except Exception:
        out["error"] = traceback.format_exc(limit=-4)
    dist.destroy_process_group()
    return pack(out)


def test_coalesced_batches_match_gloo():
    gloo = run_unpacked(_batches, 2, "gloo", timeout=120)
    ours = run_unpacked(_batches, 2, "dicomm", timeout=120)
    for rank in range(2):
        assert "error" not in gloo[rank], f"the gloo reference failed on rank {rank}:\n{gloo[rank]['error']}"
        assert "error" not in ours[rank], f"dicomm failed on rank {rank}:\n{ours[rank]['error']}"
        assert ours[rank].pop("batch works") == 1  # NCCL's contract: one work for the batch
        gloo[rank].pop("batch works")
        assert_same_results(ours[rank], gloo[rank], f"rank {rank}")


def _failing_batch(rank: int, ws: int, store) -> dict:
    import dicomm
    init_process_group("dicomm", rank, ws, store, timeout_s=30)
    out: dict = {}
    with dist._coalescing_manager(device=CPU, async_ops=True) as cm:
        ok = torch.full((2,), float(rank))
        dist.all_reduce(ok, async_op=True)
        if rank == 0:
            dist.isend(torch.ones(8), 1)
        else:
            dist.irecv(torch.empty(4), 0)  # too small: the batch must fail, naming the mismatch
    try:
        cm.wait()
        out["batch"] = "ok"
    except dicomm.MismatchError as e:
        out["batch"] = "MismatchError: " + str(e)
    except Exception as e:  # the wrong kind of error
        out["batch"] = f"{type(e).__name__}: {e}"
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)  # the group goes on after a failed batch
    out["after"] = t
    # The batch failed at its first failure; its all_reduce ran before the one just waited for
    # (collectives run in order), so it is done by now.
    out["all_reduce"] = ok
    dist.destroy_process_group()
    return pack(out)


def test_a_failed_operation_fails_its_batch():
    for rank, out in enumerate(run_unpacked(_failing_batch, 2, timeout=120)):
        assert out["all_reduce"].tolist() == [1.0, 1.0]
        assert out["after"].tolist() == [3.0]
        if rank == 1:
            assert out["batch"].startswith("MismatchError") and "holds only 16 B" in out["batch"], out["batch"]


@pytest.mark.parametrize("calls", [["end"], ["start", "start", "end"]])
def test_unpaired_coalescing_calls(calls):
    """endCoalescing without a start is a clear error; a second start (an exception inside
    _coalescing_manager skipped the end) begins a new batch instead of collecting forever."""
    got = run_unpacked(_unpaired, 1, calls, timeout=60)[0]
    if calls == ["end"]:
        assert got.startswith("ValueError") and "without startCoalescing" in got, got
    else:
        assert got == "ok", got


def _unpaired(rank: int, ws: int, store, calls: list[str]) -> str:
    init_process_group("dicomm", rank, ws, store, timeout_s=30)
    pg = dist.group.WORLD
    try:
        for c in calls:
            if c == "start":
                pg._start_coalescing(CPU)
                dist.all_reduce(torch.ones(1), async_op=True)
            else:
                work = pg._end_coalescing(CPU)
                work.wait()
        result = "ok"
    except Exception as e:
        result = f"{type(e).__name__}: {e}"
    dist.destroy_process_group()
    return result
