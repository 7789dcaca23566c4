"""Point-to-point transfers, as a pipeline's stage hand-offs issue them, and two collectives, under a
stats and a full Capture through each op hook: ``python -m ditorch_precision.examples.dist_transfers
OUT WORLD PORT`` (world 2; one process per rank on gloo). Ranks 0 and 1 exchange tensors with
send/recv (one from any source), isend/irecv and batch_isend_irecv, in a module and in backward,
then all-reduce and reduce a gradient. One received buffer is first reached through a view, one is
received into a row of a larger tensor, one is never used. Each rank writes
OUT/{stats,full}/{python,auto}/capture/rank{r}/ (hook "python", then hook "auto") and
OUT/tensors_rank{r}.pt: per transfer in issue order, what it sent or (once complete) received, taken
after the captures."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ditorch_precision import Capture
from ditorch_precision.examples import gloo_job

MODES = ("stats", "full")
HOOKS = ("python", "auto")


class Stage(torch.nn.Module):
    """A stage that hands its activation to the peer and receives the peer's."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x, peer: int, moved: list):
        y = self.lin(x)
        got = torch.empty_like(y)
        sent = y.detach()
        ops = [dist.P2POp(dist.isend, sent, peer, tag=7), dist.P2POp(dist.irecv, got, peer, tag=7)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        moved += [("sent", sent), ("received", got)]
        return y + got


def program(rank: int) -> list[tuple[str, torch.Tensor]]:
    """This rank's transfers; returns (direction, the tensor sent or received into) for each, in issue
    order (the program does not write them afterwards)."""
    peer, moved = 1 - rank, []
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3) * (rank + 1)
    if rank == 0:
        for t, tag in ((x, 0), (torch.arange(4) + 7, 5), (torch.ones(3) * 0.5, 6), (x * 3, 8), (x - 2, 9)):
            dist.send(t, 1, tag=tag)
            moved.append(("sent", t))
    else:
        got, ints, anyone = torch.empty(6), torch.empty(4, dtype=torch.int64), torch.empty(3)
        big, unused = torch.zeros(4, 6), torch.empty(2, 3)
        dist.recv(got, 0)
        dist.recv(ints, 0, tag=5)
        dist.recv(anyone, tag=6)  # from any source: its source is known once it completed
        dist.recv(big[1], 0, tag=8)  # into a row of a larger tensor
        dist.recv(unused, 0, tag=9)  # never used: read when the capture ends
        moved += [("received", t) for t in (got, ints, anyone, big[1], unused)]
        got.view(2, 3).t()  # views only: the buffer is not read yet
        anyone.neg()
        (got * 2 + ints.sum()).sum()
        big.sum()
    y, sent = torch.empty(2, 3), x + 1
    pending = dist.irecv(y, peer, tag=2)
    dist.isend(sent, peer, tag=2).wait()
    pending.wait()
    moved += [("received", y), ("sent", sent)]
    y.mul(3)
    torch.manual_seed(0)
    stage = Stage()
    h = (torch.randn(2, 3) + rank).requires_grad_()
    if rank == 1:  # rank 1 hands the gradient of its input to rank 0 in backward
        h.register_hook(lambda g: moved.append(("sent", g)) or dist.send(g, 0, tag=11))
    out = stage(h, peer, moved)
    if rank == 0:
        grad = torch.empty(2, 3)
        dist.recv(grad, 1, tag=11)
        moved.append(("received", grad))
        out.backward(grad)
    else:
        out.sum().backward()
    dist.all_reduce(h.grad.clone())
    dist.reduce(h.grad.clone(), dst=0)  # a collective that returns only its Work
    return moved


def worker(rank: int, world: int, port: int, out: str) -> None:
    with gloo_job.joined(rank, world, port):
        moved = []
        for mode in MODES:
            for hook in HOOKS:
                with Capture(os.path.join(out, mode, hook, "capture", f"rank{rank}"), mode=mode, hook=hook):
                    moved = program(rank)
        torch.save([(direction, t.clone()) for direction, t in moved], os.path.join(out, f"tensors_rank{rank}.pt"))


def main() -> None:
    p = gloo_job.parser()
    a = p.parse_args()
    if a.world != 2:
        p.error(f"world {a.world}; expected 2 (ranks 0 and 1 exchange tensors)")
    gloo_job.start(worker, (a.world, a.port, a.out), a.world, a.start_method)


if __name__ == "__main__":
    main()
