"""Tied embeddings across stages: the first stage's embedding and the last stage's output head are one
matrix. Each holds a copy; before every optimizer step the ranks of both stages sum their gradients into one
full-size buffer (one all-reduce over Groups.tie), so both copies take the same update from the same total
gradient, as Megatron does for its word embeddings. Replica 0 of each stage keeps the total and the other
replicas zero, so the DP reduction inside the optimizer adds it up exactly once. In a plan of replica groups
the group spans every holder of either copy in every group, and every holder keeps the total (its optimizer
reduces nothing further: replica_groups.py)."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..model.grads import grad_of
from ..model.init import global_slice
from ..model.parallel import TPGroup
from .topology import Groups

TIED_NAMES = ("embed.weight", "head.weight")


def sync_tied_grads(named: list[tuple[str, nn.Parameter]], g: Groups, replica: int) -> None:
    if g.tie is not None:
        sum_tied_grads(named, g.tie, g.tp, keep=replica == 0)


def sum_tied_grads(named: list[tuple[str, nn.Parameter]], group: Any, tp: TPGroup, keep: bool) -> None:
    """This rank's copies' gradients (its TP slice of each) summed with every rank of `group` in a full-size
    buffer; `keep`: this rank takes the total, else zero."""
    ends = [p for name, p in named if name in TIED_NAMES]
    if not ends:
        return
    full, _, _, _ = global_slice(ends[0], tp.rank, tp.size)
    buf = torch.zeros(full, dtype=torch.float32)  # fp32 whatever the weights' dtype: the gradient reduction's
    spans = []
    for p in ends:
        _, dim, a, b = global_slice(p, tp.rank, tp.size)
        rows = slice(a, b) if dim is not None else slice(None)
        grad = grad_of(p)
        buf[rows] += grad.float().cpu()
        spans.append((grad, rows))
    dist.all_reduce(buf, group=group)
    for grad, rows in spans:  # in place: the gradient is a view of the optimizer's flat buffer
        if keep:
            grad.copy_(buf[rows])
        else:
            grad.zero_()
