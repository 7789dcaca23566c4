"""Tensor-parallel context and the two Megatron communication functions (f and g in the paper's notation)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .grads import grad_of


@dataclass(frozen=True)
class TPGroup:
    """The TP group a stage's rank belongs to; size 1 (group None) makes every collective a no-op."""
    rank: int = 0
    size: int = 1
    group: Any = None

    def all_reduce(self, t: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        if self.size > 1:
            dist.all_reduce(t, op=op, group=self.group)
        return t


class _CopyToTP(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient backward (the input feeds every rank's shard)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
        ctx.tp = tp
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        return ctx.tp.all_reduce(g.contiguous().clone()), None


class _ReduceFromTP(torch.autograd.Function):
    """All-reduce forward (sums the row-parallel partial outputs); identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
        return tp.all_reduce(x.contiguous().clone())

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        return g, None


def copy_to_tp(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    return x if tp.size == 1 else _CopyToTP.apply(x, tp)


def reduce_from_tp(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    return x if tp.size == 1 else _ReduceFromTP.apply(x, tp)


def sync_replicated_grads(params: list[torch.Tensor], tp: TPGroup) -> None:
    """Sum the gradients of parameters that `replicas` consecutive TP ranks hold identically (each rank's
    gradient covers only its own query heads). One all-reduce over the TP group for all of them: every
    rank writes its gradient into its replica set's slot of a zeroed buffer, so each slot sums its set."""
    shared = [(p, gp) for p in params if getattr(p, "tp_replicas", 1) > 1 and (gp := grad_of(p)) is not None]
    if not shared or tp.size == 1:
        return
    reps = {p.tp_replicas for p, _ in shared}
    if len(reps) != 1:
        raise ValueError(f"replicated parameters of one stage disagree on their replica count: {sorted(reps)}")
    slots = tp.size // reps.pop()
    flat = torch.cat([gp.reshape(-1) for _, gp in shared])
    buf = torch.zeros(slots, flat.numel(), dtype=flat.dtype, device=flat.device)
    buf[tp.rank * slots // tp.size] = flat
    tp.all_reduce(buf)
    summed, offset = buf[tp.rank * slots // tp.size], 0
    for _, gp in shared:
        gp.copy_(summed[offset:offset + gp.numel()].view_as(gp))  # in place: it may be a view of a flat buffer
        offset += gp.numel()
