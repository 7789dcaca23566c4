"""Every c10d collective with a cross-rank invariant, and DDP's gradient all-reduce (issued by its C++
reducer through the dispatcher's c10d ops), under Capture and AutoCompare on a gloo job, one process
per rank: ``python -m ditorch_precision.examples.dist_collectives OUT WORLD PORT``. Each rank writes
OUT/capture/rank{r}/, OUT/autocompare_rank{r}.json (the cross-rank rows) and OUT/ddp_rank{r}.pt
(its own gradients without DDP and the gradients DDP left)."""
from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist

from ditorch_precision import AutoCompare, Capture


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
    if rank == 0:
        dist.send(data(5), 1)
    elif rank == 1:
        dist.recv(torch.empty(5), 0)


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


def worker(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    run(rank, world, out)
    dist.destroy_process_group()


def run(rank: int, world: int, out: str) -> None:
    """This rank's part, in a process group already started (another example's job may share it)."""
    with Capture(os.path.join(out, "capture", f"rank{rank}")), AutoCompare() as ac:
        collectives(rank, world)
        ddp_step(rank, world, out)
        ac.check_collectives()  # while the process group is alive
    with open(os.path.join(out, f"autocompare_rank{rank}.json"), "w") as f:
        json.dump({"failures": ac.failures, "collectives": [r for r in ac.results if r.get("rule") in
                                                            ("collective", "skipped") and "detail" in r]}, f)
    dist.barrier()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("world", type=int)
    p.add_argument("port", type=int)
    a = p.parse_args()
    torch.multiprocessing.spawn(worker, args=(a.world, a.port, a.out), nprocs=a.world)


if __name__ == "__main__":
    main()
