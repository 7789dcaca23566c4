"""Column- and row-parallel linear layers whose weight gradient can be deferred (zero-bubble schedules).

During an `I` (input-gradient) pass the executor opens a WeightGradStore; each linear layer's backward
then returns only the input gradient and queues the weight-gradient matmul, which the later `W` pass runs.
Deferring here, rather than through autograd's own input/weight split, keeps a recomputed (checkpointed)
forward from being replayed once per parameter group.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .grads import accumulate, accumulate_linear
from .init import full_init, shard
from .parallel import TPGroup, copy_to_tp, reduce_from_tp


class WeightGradStore:
    """Weight-gradient work queued while open; `flush()` runs it (the W action)."""
    _open: "WeightGradStore | None" = None

    def __init__(self) -> None:
        self.queue: list[Callable[[], None]] = []

    def __enter__(self) -> "WeightGradStore":
        WeightGradStore._open = self
        return self

    def __exit__(self, *exc) -> None:
        WeightGradStore._open = None

    def flush(self) -> None:
        # outside autograd's backward grad mode is on: recording here would give each weight gradient a
        # graph holding the saved activations until the gradients are cleared
        with torch.no_grad():
            for fn in self.queue:
                fn()
        self.queue.clear()


def _accumulate(w: torch.Tensor, x: torch.Tensor, g: torch.Tensor) -> None:
    accumulate_linear(w, g.reshape(-1, g.shape[-1]), x.reshape(-1, w.shape[-1]))


def _accumulate_bias(b: torch.Tensor, g: torch.Tensor) -> None:
    accumulate(b, g.reshape(-1, g.shape[-1]).sum(0))


class _Linear(torch.autograd.Function):
    """y = x W^T (+ b); backward computes dx now and dW (db) now or later (when a WeightGradStore is open).

    x may end in two dimensions that together are the input features ([b, s, heads, head_dim], a transposed
    view of the attention's output): it is kept for backward as given, so no reshaped copy outlives the call."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        # The parameters themselves, not their saved copies: under checkpointing saved tensors come back as
        # aliases, and a gradient put on an alias would be lost.
        ctx.param, ctx.bias = w, b
        if x.dim() == 4 and x.shape[-1] != w.shape[-1] and x.shape[-2] * x.shape[-1] == w.shape[-1]:
            x = x.flatten(-2)  # any other shape goes to the product as it is (and fails there if wrong)
        # addmm as nn.Linear does it (the same kernel and rounding as transformers' projections)
        return x @ w.t() if b is None else torch.nn.functional.linear(x, w, b)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x, w = ctx.saved_tensors
        param, bias, store = ctx.param, ctx.bias, WeightGradStore._open

        def weight_grads() -> None:
            _accumulate(param, x, g)
            if bias is not None:
                _accumulate_bias(bias, g)

        if store is None:
            weight_grads()
        else:
            store.queue.append(weight_grads)
        return (g @ w).view(x.shape), None, None


class _ParallelLinear(nn.Module):
    shard_dim: int

    def __init__(self, in_features: int, out_features: int, tp: TPGroup, *, seed: int, layer: int, name: str,
                 std: float, replicas: int = 1, bias: bool = False) -> None:
        super().__init__()
        self.tp = tp
        full = full_init(seed, layer, name, (out_features, in_features), std)
        self.weight = nn.Parameter(shard(full, self.shard_dim, tp.rank, tp.size, replicas))
        self.weight.shard_dim = self.shard_dim  # type: ignore[attr-defined]
        # TP ranks holding this same slice: their gradients are partial sums (see sync_replicated_grads).
        self.weight.tp_replicas = replicas  # type: ignore[attr-defined]
        self.bias: nn.Parameter | None = None
        if bias:  # column-parallel only: a bias is split with the output features (zeros, as transformers starts)
            self.bias = nn.Parameter(shard(torch.zeros(out_features), 0, tp.rank, tp.size, replicas))
            self.bias.shard_dim = 0  # type: ignore[attr-defined]
            self.bias.tp_replicas = replicas  # type: ignore[attr-defined]


class ColumnParallelLinear(_ParallelLinear):
    """Output features split over TP; input replicated, output sharded."""
    shard_dim = 0

    def forward(self, x: torch.Tensor, copied: bool = False) -> torch.Tensor:
        """`copied`: x already went through copy_to_tp (q, k and v share one gradient all-reduce)."""
        return _Linear.apply(x if copied else copy_to_tp(x, self.tp), self.weight, self.bias)


class RowParallelLinear(_ParallelLinear):
    """Input features split over TP; partial outputs summed across the group."""
    shard_dim = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return reduce_from_tp(_Linear.apply(x, self.weight), self.tp)
