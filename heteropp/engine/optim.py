"""AdamW over a flat parameter buffer, with ZeRO-1: each DP rank keeps optimizer state for 1/dp of it.

Gradients are all-reduced inside the DP group (chips of one type), each rank updates its shard, and the
updated shards are all-gathered. Adam is elementwise, so a sharded update equals the unsharded one.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class ZeroAdamW:
    def __init__(self, params: list[nn.Parameter], lr: float, dp_group=None, dp_rank: int = 0, dp_size: int = 1,
                 betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.01) -> None:
        self.params, self.lr, self.betas, self.eps, self.wd = params, lr, betas, eps, weight_decay
        self.group, self.dp_rank, self.dp_size = dp_group, dp_rank, dp_size
        total = sum(p.numel() for p in params)
        self.shard = -(-total // dp_size)
        self.padded = self.shard * dp_size
        self.m = torch.zeros(self.shard, device=params[0].device)
        self.v = torch.zeros(self.shard, device=params[0].device)
        self.t = 0

    def _flat(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return torch.cat([flat, flat.new_zeros(self.padded - flat.numel())])

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        missing = [i for i, p in enumerate(self.params) if p.grad is None]
        if missing:
            raise RuntimeError(f"parameters {missing} got no gradient this step")
        grads = self._flat([p.grad for p in self.params])
        if self.dp_size > 1:
            dist.all_reduce(grads, group=self.group)
        lo = self.dp_rank * self.shard
        g = grads[lo:lo + self.shard]
        w = self._flat([p.detach() for p in self.params])
        mine = w[lo:lo + self.shard]
        self.t += 1
        b1, b2 = self.betas
        self.m.mul_(b1).add_(g, alpha=1 - b1)
        self.v.mul_(b2).addcmul_(g, g, value=1 - b2)
        mhat, vhat = self.m / (1 - b1 ** self.t), self.v / (1 - b2 ** self.t)
        mine.mul_(1 - self.lr * self.wd).sub_(self.lr * mhat / (vhat.sqrt() + self.eps))
        if self.dp_size > 1:
            shards = [torch.empty_like(mine) for _ in range(self.dp_size)]
            dist.all_gather(shards, mine.contiguous(), group=self.group)
            w = torch.cat(shards)
        with torch.no_grad():
            off = 0
            for p in self.params:
                p.copy_(w[off:off + p.numel()].view_as(p))
                off += p.numel()
