"""Every collective torch.distributed offers, on dicomm and on gloo, with the same inputs.

Processes on one host stand in for nodes; CPU tensors stand in for device tensors. One run per
backend and world size makes every call; the test compares dicomm's results with gloo's (the
reference) rank by rank. Where gloo lacks something (PREMUL_SUM, int16) the gloo run computes it
with SUM or in int32; all_reduce results are also checked against a single-process computation.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from tests.dicomm.backend_testlib import (ALL_DTYPES, assert_same_results, make_floats, make_input,
                                          pack, run_unpacked)
from tests.dicomm.multiproc import init_process_group

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
COMMON_OPS = {"sum": ReduceOp.SUM, "product": ReduceOp.PRODUCT, "min": ReduceOp.MIN,
              "max": ReduceOp.MAX}
BITWISE_OPS = {"band": ReduceOp.BAND, "bor": ReduceOp.BOR, "bxor": ReduceOp.BXOR}


def _ops_for(dtype: torch.dtype) -> dict[str, ReduceOp]:
    if dtype == torch.bool:
        return dict(BITWISE_OPS, min=ReduceOp.MIN, max=ReduceOp.MAX)
    if dtype in FLOATS:
        return dict(COMMON_OPS, avg=ReduceOp.AVG)
    return dict(COMMON_OPS, **BITWISE_OPS)


def _all_reduce(t: torch.Tensor, op: ReduceOp, backend: str) -> None:
    if backend == "gloo" and t.dtype == torch.int16:  # gloo has no int16: reduce it widened
        wide = t.to(torch.int32)
        dist.all_reduce(wide, op)
        t.copy_(wide)
    else:
        dist.all_reduce(t, op)


def _reductions(rank: int, ws: int, backend: str, out: dict) -> None:
    for dtype in ALL_DTYPES:
        for name, op in _ops_for(dtype).items():
            t = make_input(f"ar/{dtype}/{name}", rank, (5,), dtype)
            _all_reduce(t, op, backend)
            out[f"all_reduce/{dtype}/{name}"] = t
    big = make_floats("ar/big", rank, (1 << 18) + 3)
    dist.all_reduce(big)
    out["~all_reduce/big_float32"] = big
    ncontig = make_input("ar/ncontig", rank, (6, 4)).t()
    dist.all_reduce(ncontig)
    out["all_reduce/non_contiguous"] = ncontig
    t = make_input("ar/premul", rank, (9,))
    if backend == "gloo":
        t.mul_(2.5)
        dist.all_reduce(t)
    else:
        dist.all_reduce(t, dist._make_nccl_premul_sum(2.5))
    out["all_reduce/premul_sum"] = t
    for root in range(ws):
        for name, op in (("sum", ReduceOp.SUM), ("max", ReduceOp.MAX)):
            t = make_input(f"reduce/{root}/{name}", rank, (3, 5), torch.int32)
            dist.reduce(t, root, op)
            if rank == root:
                out[f"reduce/root{root}/{name}"] = t


def _movement(rank: int, ws: int, backend: str, out: dict) -> None:
    for root in range(ws):
        t = make_input(f"bc/{root}", rank, (3, 4), torch.float64)
        dist.broadcast(t, root)
        out[f"broadcast/root{root}"] = t
    t = make_input("bc/ncontig", rank, (4, 3), torch.int32).t()
    dist.broadcast(t, ws - 1)
    out["broadcast/non_contiguous"] = t

    x = make_input("ag", rank, (2, 3), torch.bfloat16)
    outs = [torch.empty(2, 3, dtype=torch.bfloat16) for _ in range(ws)]
    dist.all_gather(outs, x)
    out["all_gather"] = outs
    flat = torch.empty(ws * 2, 3, dtype=torch.bfloat16)
    dist.all_gather_single(flat, x)
    out["all_gather_single"] = flat

    for root in (0, ws - 1):
        x = make_input(f"gather/{root}", rank, (4,), torch.int64)
        outs = [torch.empty(4, dtype=torch.int64) for _ in range(ws)] if rank == root else None
        dist.gather(x, outs, dst=root)
        if rank == root:
            out[f"gather/root{root}"] = outs
        ins = [make_input(f"scatter/{root}/{i}", root, (3,), torch.uint8) for i in range(ws)]
        y = torch.empty(3, dtype=torch.uint8)
        dist.scatter(y, ins if rank == root else None, src=root)
        out[f"scatter/root{root}"] = y

    ins = [make_input(f"rs/{i}", rank, (4,), torch.int32) for i in range(ws)]
    y = torch.empty(4, dtype=torch.int32)
    dist.reduce_scatter(y, ins, ReduceOp.SUM)
    out["reduce_scatter"] = y
    for name, op in (("sum", ReduceOp.SUM), ("max", ReduceOp.MAX)):
        x = make_input(f"rst/{name}", rank, (ws * 6,), torch.float32)
        y = torch.empty(6)
        dist.reduce_scatter_single(y, x, op)
        out[f"reduce_scatter_single/{name}"] = y
        assert torch.equal(x, make_input(f"rst/{name}", rank, (ws * 6,), torch.float32)), \
            "reduce_scatter_single modified its input"

    ins = [make_input(f"a2a/{rank}/{j}", rank, (rank + j + 1,), torch.int32) for j in range(ws)]
    outs = [torch.empty(i + rank + 1, dtype=torch.int32) for i in range(ws)]
    if backend == "gloo":  # gloo's list all_to_all needs equal sizes: use the flat form
        y = torch.empty(sum(o.numel() for o in outs), dtype=torch.int32)
        dist.all_to_all_single(y, torch.cat(ins), [o.numel() for o in outs],
                               [i.numel() for i in ins])
        outs = list(y.split([o.numel() for o in outs]))
    else:
        dist.all_to_all(outs, ins)
    out["all_to_all/uneven"] = outs
    x = make_input("a2as", rank, (ws * 2, 3), torch.float16)
    y = torch.empty_like(x)
    dist.all_to_all_single(y, x)
    out["all_to_all_single/even"] = y
    in_splits = [(rank + j) % 3 for j in range(ws)]  # zero-sized slices included
    out_splits = [(i + rank) % 3 for i in range(ws)]
    x = make_input("a2au", rank, (sum(in_splits), 2), torch.int64)
    y = torch.full((sum(out_splits), 2), -99, dtype=torch.int64)
    dist.all_to_all_single(y, x, out_splits, in_splits)
    out["all_to_all_single/uneven"] = y
    dist.barrier()


def _objects_and_groups(rank: int, ws: int, backend: str, out: dict) -> None:
    objs = [{"from": rank, "payload": list(range(rank + 2))}, "text"] if rank == 1 else [None, None]
    dist.broadcast_object_list(objs, src=1)
    out["broadcast_object_list"] = objs
    gathered = [None] * ws
    dist.all_gather_object(gathered, ("rank", rank, "x" * rank))
    out["all_gather_object"] = gathered
    got = [None] * ws if rank == 0 else None
    dist.gather_object({"r": rank}, got, dst=0)
    out["gather_object"] = got
    recv = [None]
    dist.scatter_object_list(recv, [f"item{i}" for i in range(ws)] if rank == 0 else None, src=0)
    out["scatter_object_list"] = recv

    edge = dist.new_group([0, ws - 1], backend=backend)  # every rank calls; some are outside
    odd = dist.new_group([r for r in range(ws) if r % 2], backend=backend)
    t = make_input("group/edge", rank, (4,), torch.int32)
    work = dist.all_reduce(t, group=edge, async_op=True)
    assert (work is None) == (rank not in (0, ws - 1)), "only members get a Work"
    if work is not None:
        work.wait()
        out["new_group/all_reduce"] = t
        out["new_group/rank_in_group"] = dist.get_rank(edge)
    if rank % 2:
        t = make_input("group/odd", rank, (3,), torch.float32)
        dist.broadcast(t, src=1, group=odd)
        out["new_group/broadcast_from_global_rank1"] = t
    dist.destroy_process_group(odd)


def _async_and_futures(rank: int, ws: int, backend: str, out: dict) -> None:
    t = make_input("async", rank, (8,), torch.int64)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    value = fut.wait()
    assert value[0] is t, "the future's value must be the reduced tensor itself"
    assert backend == "gloo" or work.is_completed()  # gloo marks it a moment later
    out["async/all_reduce"] = t
    ts = [make_input(f"coal/{i}", rank, (i + 2,), torch.float32) for i in range(3)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for x in ts:
            dist.all_reduce(x)
    cm.wait()
    out["coalesced/all_reduce"] = ts
    xs = [make_input(f"coal/ag/{i}", rank, (i + 1,), torch.int32) for i in range(2)]
    ags = [torch.empty(ws * (i + 1), dtype=torch.int32) for i in range(2)]
    rss = [torch.empty(i + 1, dtype=torch.int32) for i in range(2)]
    with dist._coalescing_manager():
        for x, y in zip(xs, ags):
            dist.all_gather_single(y, x)
    with dist._coalescing_manager():
        for y, x in zip(rss, ags):
            dist.reduce_scatter_single(y, x)
    out["coalesced/all_gather_single"], out["coalesced/reduce_scatter_single"] = ags, rss
    if ws != 2:
        return
    x = make_input("fcol", rank, (5,), torch.float32)
    rs_in = make_input("fcol/rs", rank, (ws * 2,), torch.float32)
    if backend == "gloo":  # the reference: the same operations through the eager API
        ar, ag, rs = x.clone(), torch.empty(ws * 5), torch.empty(2)
        dist.all_reduce(ar)
        dist.all_gather_single(ag, x)
        dist.reduce_scatter_single(rs, rs_in)
    else:  # functional collectives reach the group through torch's C++ dispatcher
        import torch.distributed._functional_collectives as fcol
        world = dist.group.WORLD
        ar = fcol.wait_tensor(fcol.all_reduce(x, "sum", world))
        ag = fcol.wait_tensor(fcol.all_gather_tensor(x, 0, world))
        rs = fcol.wait_tensor(fcol.reduce_scatter_tensor(rs_in, "sum", 0, world))
    out["functional/all_reduce"], out["functional/all_gather"] = ar, ag
    out["functional/reduce_scatter"] = rs


def _every_collective(rank: int, ws: int, store, backend: str) -> dict:
    if backend == "dicomm":
        import dicomm  # noqa: F401
    init_process_group(backend, rank, ws, store)
    out: dict = {}
    _reductions(rank, ws, backend, out)
    _movement(rank, ws, backend, out)
    _objects_and_groups(rank, ws, backend, out)
    _async_and_futures(rank, ws, backend, out)
    dist.destroy_process_group()
    return pack(out)


def _local_all_reduce(name: str, dtype: torch.dtype, ws: int) -> torch.Tensor:
    xs = torch.stack([make_input(f"ar/{dtype}/{name}", r, (5,), dtype) for r in range(ws)])
    if name in ("sum", "avg"):
        s = xs.sum(0, dtype=dtype)
        return s / ws if name == "avg" else s
    if name == "product":
        return xs.prod(0, dtype=dtype)
    if name in ("min", "max"):
        return xs.amin(0) if name == "min" else xs.amax(0)
    fn = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[name]
    acc = xs[0]
    for x in xs[1:]:
        acc = fn(acc, x)
    return acc


@pytest.fixture(scope="module", params=[2, 3])
def results(request) -> tuple[int, list[dict], list[dict]]:
    ws = request.param
    gloo = run_unpacked(_every_collective, ws, "gloo", timeout=120)
    dicomm = run_unpacked(_every_collective, ws, "dicomm", timeout=120)
    return ws, gloo, dicomm


def test_dicomm_matches_gloo_on_every_collective(results):
    ws, gloo, dicomm = results
    for rank in range(ws):
        assert_same_results(dicomm[rank], gloo[rank], f"rank {rank} of {ws}")


def test_all_reduce_matches_a_single_process_computation(results):
    ws, gloo, dicomm = results
    for backend, res in (("gloo", gloo), ("dicomm", dicomm)):
        for dtype in ALL_DTYPES:
            for name in _ops_for(dtype):
                want = _local_all_reduce(name, dtype, ws)
                got = res[0][f"all_reduce/{dtype}/{name}"]
                torch.testing.assert_close(got, want, msg=f"{backend} {dtype} {name}")

