"""Every c10d collective with a cross-rank invariant, and DDP's gradient all-reduce (issued by its C++
reducer through the dispatcher's c10d ops), point-to-point transfers (then once more with one received
value corrupted) and collectives of a subgroup, under Capture and AutoCompare on a gloo job, one process
per rank: ``python -m ditorch_precision.examples.dist_collectives OUT WORLD PORT [--subgroup]``. Each
rank writes OUT/capture/rank{r}/ (OUT/corrupted/capture/rank{r}/: the corrupted transfers), OUT/autocompare_rank{r}.json
(the cross-rank rows) and OUT/ddp_rank{r}.pt
(its own gradients without DDP and the gradients DDP left). ``--subgroup`` (world 3 or more): only the
calls of the group of global ranks 1 and 2 (``subgroup``), into OUT/capture/rank{r}/ and
OUT/autocompare_rank{r}.json."""
from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist

from ditorch_precision import AutoCompare, Capture
from ditorch_precision.examples import gloo_job


def collectives(rank: int, world: int) -> None:
    """One call of each: each rank's data differs (rank-dependent values)."""
    def data(n: int) -> torch.Tensor:
        return torch.arange(n, dtype=torch.float32) * 0.25 + rank + 1

    dist.reduce_scatter(torch.empty(3), [data(3) + i for i in range(world)])
    dist.reduce_scatter_tensor(torch.empty(2), data(2 * world))
    dist.all_to_all([torch.empty(2) for _ in range(world)], [data(2) * (i + 1) for i in range(world)])
    dist.all_to_all_single(torch.empty(2 * world), data(2 * world))
    dist.reduce(data(4), dst=0)
    dist.gather(data(3), [torch.empty(3) for _ in range(world)] if rank == 0 else None, dst=0)
    dist.scatter(torch.empty(2), [data(2) * (i + 1) for i in range(world)] if rank == 0 else None, src=0)
    for op in (dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
        dist.all_reduce(data(4) * (1 - 2 * (rank % 2)), op=op)  # signs differ across ranks
    dist.all_reduce(torch.tensor([rank, 5 - rank, 3]), op=dist.ReduceOp.MAX)  # integers, with a tie
    dist.all_reduce(torch.tensor([rank + 1, 7]))  # an integer SUM (a count of tokens, say)
    sign = 1 - 2 * (rank % 2)  # elementwise reductions whose result is on one rank, or wraps around
    dist.reduce(data(4) * sign, dst=world - 1, op=dist.ReduceOp.MAX)
    dist.reduce_scatter(torch.empty(3), [data(3) * sign + i for i in range(world)], op=dist.ReduceOp.MIN)
    dist.reduce_scatter_tensor(torch.empty(2), data(2 * world) * sign, op=dist.ReduceOp.PRODUCT)
    dist.reduce(torch.tensor([rank + 2, -3, 3 ** 30]), dst=0, op=dist.ReduceOp.PRODUCT)  # 3**60 wraps in int64
    dist.all_reduce(torch.tensor([rank + 2, -3, 3 ** 30]), op=dist.ReduceOp.PRODUCT)
    # A group whose only member is the last rank: its group rank 0 is global rank world - 1.
    last = dist.new_group([world - 1])
    if rank == world - 1:
        dist.all_reduce(data(3), group=last)
        dist.scatter(torch.empty(2), [data(2)], src=rank, group=last)
    dist.all_reduce(data(2))  # the default group's sequence goes on after the subgroup's calls


LARGE = 70_000  # elements: above any size an elementwise check could once only count or skip


def large_reductions(rank: int, world: int) -> None:
    """Elementwise reductions of many elements, whose values tie across ranks except at every 1000th
    element (ties let a count of equal elements hide a wrong one): a MAX all-reduce, a MAX reduce to
    the last rank and a MIN reduce-scatter."""
    ties = (torch.arange(LARGE) % 7).float()
    ties[::1000] += rank
    dist.all_reduce(ties.clone(), op=dist.ReduceOp.MAX)
    dist.reduce(ties[:LARGE // 2].clone(), dst=world - 1, op=dist.ReduceOp.MAX)
    dist.reduce_scatter_tensor(torch.empty(LARGE // world), ties[:LARGE // world * world].clone(),
                               op=dist.ReduceOp.MIN)


def point_to_point(rank: int, world: int, corrupt: bool = False) -> None:
    """Ranks 0 and 1 exchange tensors with send/recv, isend/irecv and batch_isend_irecv, on two tags.
    ``corrupt``: rank 1 changes one received value by a raw write (no op sees it), as a faulty
    transport would, before it uses the buffer."""
    if rank > 1:
        return
    peer = 1 - rank
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3) * (rank + 1)
    if rank == 0:
        dist.send(x, 1)
        dist.send(torch.arange(4) + 7, 1, tag=5)
        dist.send(torch.ones(3) * 0.5, 1, tag=6)
    else:
        got, ints, anyone = torch.empty(6), torch.empty(4, dtype=torch.int64), torch.empty(3)
        dist.recv(got, 0)
        dist.recv(ints, 0, tag=5)
        dist.recv(anyone, tag=6)  # from any source: its source is known once it completed
        anyone.neg()
        if corrupt:
            got.numpy()[4] += 0.5
        (got * 2 + ints.sum()).sum()
    y = torch.empty(2, 3)
    pending = dist.irecv(y, peer, tag=2)
    dist.isend(x + 1, peer, tag=2).wait()
    pending.wait()
    y.mul(3)
    z = torch.empty(3)
    ops = [dist.P2POp(dist.isend, x[0] - 1, peer, tag=3), dist.P2POp(dist.irecv, z, peer, tag=3)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    z.add(1)


def ddp_step(rank: int, world: int, out: str) -> None:
    torch.manual_seed(0)  # the same weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(rank))  # each rank its own data
    model(x).square().sum().backward()
    own = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp(x).square().sum().backward()
    torch.save({"own": own, "ddp": [p.grad.clone() for p in model.parameters()]},
               os.path.join(out, f"ddp_rank{rank}.pt"))


def worker(rank: int, world: int, port: int, out: str, only_subgroup: bool = False) -> None:
    with gloo_job.joined(rank, world, port, barrier=False):
        (subgroup_run if only_subgroup else run)(rank, world, out)


def run(rank: int, world: int, out: str) -> None:
    """This rank's part, in a process group already started (another example's job may share it)."""
    with Capture(os.path.join(out, "capture", f"rank{rank}")), AutoCompare() as ac:
        collectives(rank, world)
        large_reductions(rank, world)
        point_to_point(rank, world)
        ddp_step(rank, world, out)
        ac.check_collectives()  # while the process group is alive
    with Capture(os.path.join(out, "corrupted", "capture", f"rank{rank}")), AutoCompare() as corrupted:
        point_to_point(rank, world, corrupt=True)
        corrupted.check_collectives()
    with open(os.path.join(out, f"autocompare_rank{rank}.json"), "w") as f:
        json.dump({"failures": ac.failures, "collectives": _cross_rank(ac, "collective"),
                   "point_to_point": _cross_rank(ac, "point_to_point"),
                   "corrupted": _cross_rank(corrupted, "point_to_point")}, f)
    dist.barrier()


def subgroup(rank: int, world: int) -> None:
    """Collectives and transfers of the group of global ranks 1 and 2 (group ranks 0 and 1), whose
    pieces, roots and peers are group ranks: an all-reduce, a reduce-scatter, a MAX reduce to global
    rank 2 and a send from global rank 1 to 2; then, on tag 1, a transfer whose received value rank 2
    changes by a raw write (no op sees it) before it uses the buffer, as a faulty transport would."""
    pair = dist.new_group([1, 2])  # every rank takes part in creating it
    if rank in (1, 2):
        x = torch.arange(4, dtype=torch.float32) + 10 * rank
        dist.all_reduce(x.clone(), group=pair)
        dist.reduce_scatter_tensor(torch.empty(2), x.clone(), group=pair)
        dist.reduce(x.clone(), dst=2, op=dist.ReduceOp.MAX, group=pair)
        for tag in (0, 1):
            if rank == 1:
                dist.send(x + tag, dst=2, group=pair, tag=tag)
            else:
                got = torch.empty(4)
                dist.recv(got, src=1, group=pair, tag=tag)
                if tag == 1:
                    got.numpy()[3] += 0.5
                got.sum()
    dist.all_reduce(torch.ones(2) * rank)  # the whole job's group goes on after the pair's calls


def subgroup_run(rank: int, world: int, out: str) -> None:
    """This rank's part of the subgroup job (world 3 or more): OUT/capture/rank{r}/ and
    OUT/autocompare_rank{r}.json (the cross-rank rows)."""
    with Capture(os.path.join(out, "capture", f"rank{rank}")), AutoCompare() as ac:
        subgroup(rank, world)
        ac.check_collectives()
    with open(os.path.join(out, f"autocompare_rank{rank}.json"), "w") as f:
        json.dump({"failures": ac.failures, "collectives": _cross_rank(ac, "collective"),
                   "point_to_point": _cross_rank(ac, "point_to_point")}, f)
    dist.barrier()


def _cross_rank(ac: AutoCompare, rule: str) -> list[dict]:
    """The cross-rank rows of one kind (skipped collectives included), not the per-op ones."""
    kinds = ("collective", "skipped") if rule == "collective" else (rule,)
    return [r for r in ac.results if "detail" in r and r.get("rule") in kinds]


def main() -> None:
    p = gloo_job.parser()
    p.add_argument("--subgroup", action="store_true", help="only the calls of a two-rank subgroup (world >= 3)")
    a = p.parse_args()
    if a.subgroup and a.world < 3:
        p.error(f"--subgroup needs a world of 3 or more ranks, not {a.world}")
    gloo_job.start(worker, (a.world, a.port, a.out, a.subgroup), a.world, a.start_method)


if __name__ == "__main__":
    main()
