"""AdamW over a flat parameter buffer, with ZeRO-1: each DP rank keeps optimizer state for 1/dp of it.

Gradients are all-reduced inside the DP group (chips of one type), each rank updates its shard, and the
updated shards are all-gathered. Adam is elementwise, so a sharded update equals the unsharded one.

Gradient clipping by global norm: the norm is the model's, over every stage, TP rank and DP shard. Each
rank sums the squares of the gradient elements it owns (its ZeRO shard; a parameter replicated across TP
ranks counted on one of them only) and one all-reduce over all ranks (`norm_group`) adds them up.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


class ZeroAdamW:
    def __init__(self, params: list[nn.Parameter], lr: float, dp_group=None, dp_rank: int = 0, dp_size: int = 1,
                 betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.01,
                 clip_norm: float | None = None, owned: list[bool] | None = None, norm_group: Any = None,
                 distributed_norm: bool = False) -> None:
        """`clip_norm`: scale gradients so their global L2 norm is at most this (None: no clipping).
        `owned[i]`: whether this rank counts parameter i in the norm (False for a TP replica's copy).
        `distributed_norm`: the norm spans ranks (all-reduced over `norm_group`, None = the world)."""
        if clip_norm is not None and not clip_norm > 0:
            raise ValueError(f"clip_norm must be positive, got {clip_norm}")
        self.params, self.lr, self.betas, self.eps, self.wd = params, lr, betas, eps, weight_decay
        self.clip_norm, self.norm_group, self.distributed_norm = clip_norm, norm_group, distributed_norm
        self.last_norm: float | None = None
        self.group, self.dp_rank, self.dp_size = dp_group, dp_rank, dp_size
        total = sum(p.numel() for p in params)
        self.shard = -(-total // dp_size)
        self.padded = self.shard * dp_size
        dev, dtype = params[0].device, params[0].dtype
        if other := sorted({str(p.dtype) for p in params} - {str(dtype)}):
            raise ValueError(f"ZeroAdamW keeps one flat buffer, so every parameter must have one dtype: got {dtype} "
                             f"and {', '.join(other)}")
        self.m = torch.zeros(self.shard, device=dev, dtype=dtype)
        self.v = torch.zeros(self.shard, device=dev, dtype=dtype)
        # Flat gradients and weights (padding zero) and two shard-sized scratch buffers, kept across steps:
        # temporaries of this size made afresh every step come from mmap on glibc once they pass its
        # threshold, and faulting their pages in made a step 4-5x slower, by turns (3.5 vs 17 ms per layer
        # of the benchmark model on CPU).
        self._grads = torch.zeros(self.padded, device=dev, dtype=dtype)
        self._w = torch.zeros(self.padded, device=dev, dtype=dtype)
        self._num = torch.empty(self.shard, device=dev, dtype=dtype)
        self._den = torch.empty(self.shard, device=dev, dtype=dtype)
        self.t = 0
        self.owned_shard = None  # this rank's slice of the 0/1 ownership mask (float64), kept only when clipping
        if clip_norm is not None:
            owned = owned if owned is not None else [True] * len(params)
            mask = self._fill(torch.zeros(self.padded, dtype=torch.float64, device=dev),
                              [torch.full((p.numel(),), float(o), dtype=torch.float64, device=dev)
                               for p, o in zip(params, owned)])
            self.owned_shard = mask[dp_rank * self.shard:(dp_rank + 1) * self.shard].clone()

    def _fill(self, flat: torch.Tensor, tensors: list[torch.Tensor]) -> torch.Tensor:
        """`flat` with the tensors copied in, in order (its padding stays zero)."""
        off = 0
        for t in tensors:
            flat[off:off + t.numel()].copy_(t.reshape(-1))
            off += t.numel()
        return flat

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        missing = [i for i, p in enumerate(self.params) if p.grad is None]
        if missing:
            raise RuntimeError(f"parameters {missing} got no gradient this step")
        grads = self._fill(self._grads, [p.grad for p in self.params])
        if self.dp_size > 1:
            dist.all_reduce(grads, group=self.group)
        lo = self.dp_rank * self.shard
        g = grads[lo:lo + self.shard]
        if self.clip_norm is not None:
            g.mul_(self._clip_coef(g))
        w = self._fill(self._w, [p.detach() for p in self.params])
        mine = w[lo:lo + self.shard]
        self.t += 1
        b1, b2 = self.betas
        self.m.mul_(b1).add_(g, alpha=1 - b1)
        self.v.mul_(b2).addcmul_(g, g, value=1 - b2)
        # lr * mhat / (sqrt(vhat) + eps), the same operations in the same order, in place
        num = torch.div(self.m, 1 - b1 ** self.t, out=self._num).mul_(self.lr)
        den = torch.div(self.v, 1 - b2 ** self.t, out=self._den).sqrt_().add_(self.eps)
        mine.mul_(1 - self.lr * self.wd).sub_(num.div_(den))
        if self.dp_size > 1:
            self._num.copy_(mine)  # the input apart from the outputs it is gathered into
            dist.all_gather(list(w.split(self.shard)), self._num, group=self.group)
        off = 0
        for p in self.params:
            p.copy_(w[off:off + p.numel()].view_as(p))
            off += p.numel()

    def _clip_coef(self, g: torch.Tensor) -> float:
        sumsq = (g.double().square() * self.owned_shard).sum().reshape(1).cpu()
        if self.distributed_norm:
            dist.all_reduce(sumsq, group=self.norm_group)
        self.last_norm = math.sqrt(sumsq.item())
        return min(1.0, self.clip_norm / (self.last_norm + 1e-6))  # torch's clip_grad_norm_ coefficient
