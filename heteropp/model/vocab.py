"""Vocab-parallel embedding, output head and cross-entropy: the vocabulary is split over the TP group."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .init import full_init, shard
from .parallel import TPGroup, reduce_from_tp


class VocabParallelEmbedding(nn.Module):
    """Each rank looks up the tokens in its vocabulary slice; the partial embeddings are summed."""

    def __init__(self, vocab: int, hidden: int, tp: TPGroup, *, seed: int, layer: int, name: str) -> None:
        super().__init__()
        self.tp, self.per_rank = tp, vocab // tp.size
        self.weight = nn.Parameter(shard(full_init(seed, layer, name, (vocab, hidden), 0.02), 0, tp.rank, tp.size))
        self.weight.shard_dim = 0  # type: ignore[attr-defined]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return nn.functional.embedding(tokens, self.weight)
        local = tokens - self.tp.rank * self.per_rank
        outside = (local < 0) | (local >= self.per_rank)
        out = nn.functional.embedding(local.masked_fill(outside, 0), self.weight)
        return reduce_from_tp(out.masked_fill(outside.unsqueeze(-1), 0.0), self.tp)


class _VocabParallelCE(torch.autograd.Function):
    """Mean cross-entropy over tokens from logits split along the vocabulary (three small all-reduces)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, tp: TPGroup) -> torch.Tensor:
        ctx.shape = logits.shape
        logits = logits.reshape(-1, logits.shape[-1]).float()
        target = target.reshape(-1)
        vmax = tp.all_reduce(logits.max(dim=-1).values, op=dist.ReduceOp.MAX)
        shifted = logits - vmax.unsqueeze(-1)
        exp = shifted.exp()
        sum_exp = tp.all_reduce(exp.sum(dim=-1))
        local = target - tp.rank * logits.shape[-1]
        inside = (local >= 0) & (local < logits.shape[-1])
        idx = local.clamp(0, logits.shape[-1] - 1)
        picked = shifted.gather(1, idx.unsqueeze(1)).squeeze(1) * inside
        picked = tp.all_reduce(picked)
        softmax = exp / sum_exp.unsqueeze(-1)
        ctx.save_for_backward(softmax, idx, inside)
        return (sum_exp.log() - picked).mean()

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        softmax, idx, inside = ctx.saved_tensors
        grad = softmax.clone()
        grad[torch.arange(len(idx)), idx] -= inside.to(grad.dtype)
        return grad.mul_(g / len(idx)).view(ctx.shape), None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    return _VocabParallelCE.apply(logits, target, tp)
