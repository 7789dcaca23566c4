"""Splitting and merging groups on dicomm.

`ProcessGroup.split_group` is what `dist.split_group` and DeviceMesh call on a host with an
accelerator (`dist.split_group` itself refuses to run without one, on gloo too; the test does what
it does after that check: deep-copies the parent backend's options and splits), and
`merge_remote_group` joins ranks through a store. Before, dicomm could do neither ("does not
implement getBackendOptions"). Expected results are computed here: gloo cannot serve as the
reference, since torch 2.13 splits a group once per device type its backend serves (cpu and cuda),
and gloo's second child rendezvouses on the first one's store keys (a 2-rank split hung in 1 of 2
tries). Real processes, 3 ranks on CPU, one host.
"""
from __future__ import annotations

import copy
import datetime
import traceback

import torch
import torch.distributed as dist

from tests.dicomm.backend_testlib import pack, run_unpacked
from tests.dicomm.multiproc import init_process_group

CPU = torch.device("cpu")


def _allreduce(pg: dist.ProcessGroup, value: float) -> float:
    t = torch.tensor([value])
    pg.allreduce([t]).wait()
    return t.item()


def _split_and_merge(rank: int, ws: int, store) -> dict:
    init_process_group("dicomm", rank, ws, store, timeout_s=60)
    world = dist.group.WORLD
    out: dict = {"supports_splitting": world._get_backend(CPU).supports_splitting}
    try:
        options = copy.deepcopy(world._get_backend(CPU).options)  # as dist.split_group does
        sub = world.split_group([2, 0], timeout=datetime.timedelta(seconds=45), opts=options)
        out["member"] = sub is not None
        if sub is not None:
            out["rank/size"] = (sub.rank(), sub.size())
            out["timeout_s"] = sub._get_backend(CPU).options._timeout.total_seconds()
            out["sum"] = _allreduce(sub, float(rank + 1))
            b = torch.tensor([float(rank + 7)])
            sub.broadcast([b]).wait()  # from the split's rank 0
            out["broadcast"] = b.item()
            one = sub.split_group([sub.rank()])  # a split of a split: a group of one each
            out["nested"] = (one.rank(), one.size(), _allreduce(one, 5.0))
            # One communicator per child, though torch splits once per device type.
            out["rejected"] = sub._get_backend(CPU).stats()["rejected_connections"]
        # The parent splits again: what the first split wrote must not have changed it.
        again = world.split_group([0, 1, 2])
        out["again"] = (again.rank(), again.size(), _allreduce(again, float(10 * rank)))
        merged = world.merge_remote_group(dist.PrefixStore("merge", store), ws,
                                          datetime.timedelta(seconds=45))
        out["merged"] = (merged.size(), _allreduce(merged, float(rank + 1)))
        out["merged rank"] = merged.rank()  # arrival order
    except Exception:  # reported, so the test shows the error rather than a hung peer
        out["error"] = traceback.format_exc(limit=-4)
    dist.destroy_process_group()
    return pack(out)


def test_split_and_merge():
    got = run_unpacked(_split_and_merge, 3, timeout=180)
    for rank in range(3):
        assert "error" not in got[rank], f"rank {rank}:\n{got[rank]['error']}"
    assert sorted(r["merged rank"] for r in got) == [0, 1, 2]
    for rank, out in enumerate(got):
        member = {"member": True, "rank/size": ([0, 2].index(rank), 2), "timeout_s": 45.0, "sum": 4.0,
                  "broadcast": 7.0, "nested": (0, 1, 5.0), "rejected": 0} if rank != 1 else {"member": False}
        want = {"supports_splitting": True, **member,
                "again": (rank, 3, 30.0), "merged": (3, 6.0), "merged rank": out["merged rank"]}
        assert out == want, f"rank {rank}"


def _new_group_on_a_bound_default_group(rank: int, ws: int, store, backend: str) -> dict:
    """init_process_group(device_id=accelerator) binds the default group to a device; new_group
    then takes the bound backend as a split source when it can split, and asks the ranks left
    out of the new group to take part (NCCL's no-color split). A CPU host has no accelerator to
    bind, so the binding is set directly: the path below it is the one an accelerator host runs."""
    init_process_group(backend, rank, ws, store, timeout_s=60)
    dist.group.WORLD.bound_device_id = torch.device("cuda", 0)
    out: dict = {}
    try:
        pg = dist.new_group([0, 1])
        out["member"] = rank in (0, 1)
        if rank in (0, 1):
            t = torch.tensor([float(rank + 1)])
            dist.all_reduce(t, group=pg)
            out["sum"] = t
    except Exception:
        out["error"] = traceback.format_exc(limit=-4)
    dist.destroy_process_group()
    return pack(out)


def test_new_group_leaving_ranks_out_of_a_bound_default_group():
    """Before: the backend could not split; with splitting, the ranks left out need
    perform_nocolor_split (an AttributeError on a backend that lacks it)."""
    for rank, out in enumerate(run_unpacked(_new_group_on_a_bound_default_group, 3, "dicomm",
                                            timeout=120)):
        assert "error" not in out, f"rank {rank}:\n{out['error']}"
        assert out["member"] == (rank < 2)
        if rank < 2:
            assert out["sum"].tolist() == [3.0]
