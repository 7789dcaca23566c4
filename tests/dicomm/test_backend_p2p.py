"""Point-to-point through torch.distributed on dicomm, compared with gloo, plus the Work API.

Processes on one host stand in for nodes; CPU tensors stand in for device tensors. Each rank's
received tensors are compared with what gloo delivered in the same program and with the sender's
input, which every rank can recompute (inputs are a pure function of key and rank).
"""
from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from tests.dicomm.backend_testlib import assert_same_results, make_input, pack, run_unpacked
from tests.dicomm.multiproc import init_process_group


def _ring(rank: int, ws: int, backend: str, out: dict) -> None:
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    # Tags: two messages in flight to the same peer, received in the opposite order.
    a, b = make_input("tag7", rank, (5,)), make_input("tag3", rank, (9,), torch.int64)
    works = [dist.isend(a, nxt, tag=7), dist.isend(b, nxt, tag=3)]
    ra, rb = torch.empty(5), torch.empty(9, dtype=torch.int64)
    dist.recv(rb, prv, tag=3)
    dist.recv(ra, prv, tag=7)
    for w in works:
        w.wait()
    out["tags"] = [ra, rb]
    assert torch.equal(ra, make_input("tag7", prv, (5,))), "tag 7 message went astray"

    big = make_input("big", rank, (1 << 20,), torch.int32)  # 4 MiB
    got = torch.empty_like(big)
    ops = [dist.P2POp(dist.isend, big, nxt), dist.P2POp(dist.irecv, got, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    out["batch/big"] = got

    src = make_input("nc", rank, (6, 4), torch.float64).t()  # non-contiguous send and recv
    dst = torch.zeros(6, 4, dtype=torch.float64).t()
    if backend == "gloo":  # gloo takes contiguous tensors only: it sees compacted copies
        w = dist.isend(src.contiguous(), nxt)
        tmp = torch.empty(dst.shape, dtype=dst.dtype)
        dist.recv(tmp, prv)
        dst.copy_(tmp)
    else:
        w = dist.isend(src, nxt)
        dist.recv(dst, prv)
    w.wait()
    out["non_contiguous"] = dst
    assert not dst.is_contiguous()

    # Fire and forget: the Work and the tensor are dropped at once; the data must still arrive
    # intact (the backend keeps the buffer alive until the engine is done with it).
    kept = dist.isend(make_input("forget", rank, (1 << 20,), torch.int32), nxt, tag=41)
    if backend == "dicomm":
        del kept  # gloo abandons a transfer whose Work is dropped, so it keeps its Work
    junk = [torch.full((1 << 20,), -7, dtype=torch.int32) for _ in range(4)]  # reuse memory
    got = torch.empty(1 << 20, dtype=torch.int32)
    dist.recv(got, prv, tag=41)
    out["fire_and_forget"] = got
    del junk

    empty = torch.empty(0)
    w = dist.isend(empty, nxt, tag=11)
    dist.recv(torch.empty(0), prv, tag=11)
    w.wait()

    mine = make_input("self", rank, (4,), torch.bfloat16)
    back = torch.empty_like(mine)
    if backend == "gloo":  # gloo cannot send to itself; this is what arrives on dicomm
        back.copy_(mine)
    else:
        for w in [dist.isend(mine, rank, tag=5), dist.irecv(back, rank, tag=5)]:
            w.wait()
    out["to_self"] = back


def _any_source(rank: int, ws: int, out: dict) -> None:
    if rank == 0:
        seen = {}
        for _ in range(ws - 1):
            t = torch.empty(3, dtype=torch.int32)
            src = dist.recv(t, tag=21)
            seen[src] = t
        out["any_source"] = [seen[r] for r in sorted(seen)]
        out["any_source/senders"] = sorted(seen)
    else:
        dist.send(torch.full((3,), rank * 100, dtype=torch.int32), 0, tag=21)


def _work_api(rank: int, ws: int, backend: str, out: dict) -> None:
    if rank > 1:
        return
    peer = 1 - rank
    t = torch.empty(4)
    if rank == 0:
        w = dist.irecv(t, peer, tag=31)
        assert not w.is_completed(), "a receive completed before anything was sent"
        dist.barrier(group=_pair())
        w.wait(datetime.timedelta(seconds=20))
        assert w.is_completed()
        out["work/after_wait"] = t
        t2 = torch.empty(2)
        w = dist.irecv(t2, peer, tag=32)
        if backend == "gloo":  # gloo's point-to-point works have no future
            w.wait()
            out["work/future"] = t2
        else:
            out["work/future"] = w.get_future().wait()[0]
    else:
        dist.barrier(group=_pair())
        dist.send(torch.arange(4.0), peer, tag=31)
        dist.send(torch.tensor([5.0, 6.0]), peer, tag=32)


_PAIR: list = []


def _pair():
    return _PAIR[0]


def _exercise(rank: int, ws: int, store, backend: str) -> dict:
    if backend == "dicomm":
        import dicomm  # noqa: F401
    init_process_group(backend, rank, ws, store)
    _PAIR[:] = [dist.new_group([0, 1], backend=backend)]
    out: dict = {}
    _ring(rank, ws, backend, out)
    _any_source(rank, ws, out)
    _work_api(rank, ws, backend, out)
    dist.barrier()
    dist.destroy_process_group()
    return pack(out)


@pytest.fixture(scope="module")
def results() -> tuple[list[dict], list[dict]]:
    return run_unpacked(_exercise, 3, "gloo", timeout=90), \
        run_unpacked(_exercise, 3, "dicomm", timeout=90)


def test_dicomm_delivers_what_gloo_delivers(results):
    gloo, dicomm = results
    for rank in range(3):
        assert_same_results(dicomm[rank], gloo[rank], f"rank {rank}")


def test_received_data_equals_the_senders_input(results):
    _, dicomm = results
    for rank in range(3):
        prv = (rank - 1) % 3
        assert torch.equal(dicomm[rank]["batch/big"], make_input("big", prv, (1 << 20,), torch.int32))
        assert torch.equal(dicomm[rank]["non_contiguous"],
                           make_input("nc", prv, (6, 4), torch.float64).t())
        assert torch.equal(dicomm[rank]["to_self"], make_input("self", rank, (4,), torch.bfloat16))
        assert torch.equal(dicomm[rank]["fire_and_forget"],
                           make_input("forget", prv, (1 << 20,), torch.int32))
    assert dicomm[0]["any_source/senders"] == [1, 2]
    assert [t[0].item() for t in dicomm[0]["any_source"]] == [100, 200]
    assert torch.equal(dicomm[0]["work/after_wait"], torch.arange(4.0))
    assert torch.equal(dicomm[0]["work/future"], torch.tensor([5.0, 6.0]))
