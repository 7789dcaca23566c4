"""A tiny tensor-parallel feed-forward whose row-parallel output is summed by a functional collective
(``torch.distributed._functional_collectives``, what DTensor and tensor-parallel code call), one
process per rank on gloo, under a stats Capture through each op hook:
``python -m ditorch_precision.examples.dist_functional OUT WORLD PORT [--fault-rank R] [--steps N]``.

Each rank holds half of the up projection (column-parallel) and half of the down projection
(row-parallel, a plain ``mm``); the partial sums are all-reduced with ``funcol.all_reduce`` (backward:
the identity, as Megatron's row-parallel reduce). Each step also all-gathers and reduce-scatters the
hidden activations (``all_gather_single``, ``reduce_scatter_single``), and makes a process group in
the middle of the step (``dist.new_group``) that a c10d and a functional all-reduce use before the
next step. The same processes run honestly into OUT/{cpp,python}/ref and with the down projection's
mm 1e-4 off on rank R into OUT/{cpp,python}/fault; each writes .../capture/rank{r}/."""
from __future__ import annotations

import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from ditorch_precision import Capture
from ditorch_precision.examples.faults import wrong_kernel
from ditorch_precision.examples import gloo_job

HIDDEN, FFN, TOKENS = 8, 16, 6


class _SumPartials(torch.autograd.Function):
    """The row-parallel reduce: forward a functional all-reduce, backward the identity."""

    @staticmethod
    def forward(ctx, partial, group):
        return funcol.all_reduce(partial, "sum", group).wait()

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class RowParallel(torch.nn.Module):
    def __init__(self, rank: int, world: int, full: torch.Tensor, group) -> None:
        super().__init__()
        shard = full.shape[1] // world
        self.weight = torch.nn.Parameter(full[:, rank * shard:(rank + 1) * shard].clone())
        self.group = group

    def forward(self, h):
        return _SumPartials.apply(h.mm(self.weight.t()), self.group)


class TPFeedForward(torch.nn.Module):
    def __init__(self, rank: int, world: int, group) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)  # the same full weights on every rank, then sharded
        up, down = torch.randn(FFN, HIDDEN, generator=g) / 3, torch.randn(HIDDEN, FFN, generator=g) / 4
        shard = FFN // world
        self.up = torch.nn.Parameter(up[rank * shard:(rank + 1) * shard].clone())
        self.down = RowParallel(rank, world, down, group)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(x.mm(self.up.t())))


def train_once(rank: int, world: int, out: str, hook: str, fault_rank: int | None, steps: int) -> None:
    group = dist.group.WORLD
    model = TPFeedForward(rank, world, group)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)  # the same tokens on every rank (tensor parallelism)
    batches = [(torch.randn(TOKENS, HIDDEN, generator=g), torch.randn(TOKENS, HIDDEN, generator=g))
               for _ in range(steps)]
    plant = wrong_kernel("mm", 1 + 1e-4, inside=model.down) if rank == fault_rank else nullcontext()
    with plant, Capture(os.path.join(out, "capture", f"rank{rank}"), mode="stats", hook=hook):
        for x, target in batches:  # a step ends at the optimizer's
            opt.zero_grad(set_to_none=True)
            y = model(x)
            gathered = funcol.all_gather_single(y.detach(), 0, group)
            scattered = funcol.reduce_scatter_single(gathered, "avg", 0, group)
            loss = (y - target).pow(2).mean()
            loss.backward()
            # a group made in the middle of the step, used before the next one
            pair = dist.new_group(list(range(world)))
            total = loss.detach().clone()
            dist.all_reduce(total, group=pair)
            funcol.all_reduce(scattered, "max", pair).wait()
            opt.step()


def worker(rank: int, world: int, port: int, out: str, fault_rank: int | None, steps: int) -> None:
    with gloo_job.joined(rank, world, port):
        for hook in ("cpp", "python"):
            train_once(rank, world, os.path.join(out, hook, "ref"), hook, None, steps)
            train_once(rank, world, os.path.join(out, hook, "fault"), hook, fault_rank, steps)


def main() -> None:
    p = gloo_job.parser()
    p.add_argument("--fault-rank", type=int)
    p.add_argument("--steps", type=int, default=2)
    a = p.parse_args()
    if FFN % a.world:
        p.error(f"world {a.world} must divide the feed-forward size {FFN}")
    gloo_job.start(worker, (a.world, a.port, a.out, a.fault_rank, a.steps), a.world, a.start_method)


if __name__ == "__main__":
    main()
