"""Vocab-parallel embedding, output head and cross-entropy: the vocabulary is split over the TP group."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .grads import accumulate_rows
from .init import full_init, shard
from .parallel import TPGroup, reduce_from_tp


class _Lookup(torch.autograd.Function):
    """nn.functional.embedding whose backward adds the rows' gradients straight into the weight's gradient
    (autograd's embedding backward makes a dense gradient of the whole table first)."""

    @staticmethod
    def forward(ctx, tokens: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(tokens)
        ctx.param = w  # the parameter itself, not a saved alias (see _Linear)
        return nn.functional.embedding(tokens, w)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        (tokens,) = ctx.saved_tensors
        accumulate_rows(ctx.param, tokens.reshape(-1), g.reshape(-1, g.shape[-1]))
        return None, None


class VocabParallelEmbedding(nn.Module):
    """Each rank looks up the tokens in its vocabulary slice; the partial embeddings are summed."""

    def __init__(self, vocab: int, hidden: int, tp: TPGroup, *, seed: int, layer: int, name: str) -> None:
        super().__init__()
        self.tp, self.per_rank = tp, vocab // tp.size
        self.weight = nn.Parameter(shard(full_init(seed, layer, name, (vocab, hidden), 0.02), 0, tp.rank, tp.size))
        self.weight.shard_dim = 0  # type: ignore[attr-defined]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return _Lookup.apply(tokens, self.weight)
        local = tokens - self.tp.rank * self.per_rank
        outside = (local < 0) | (local >= self.per_rank)
        out = _Lookup.apply(local.masked_fill(outside, 0), self.weight)
        return reduce_from_tp(out.masked_fill(outside.unsqueeze(-1), 0.0), self.tp)


class _VocabParallelCE(torch.autograd.Function):
    """Mean cross-entropy over tokens from logits split along the vocabulary (three small all-reduces)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, tp: TPGroup) -> torch.Tensor:
        # One fp32 tokens x vocabulary buffer beside the logits, worked in place (shifted, then exp, then the
        # softmax that backward turns into the gradient): these are the largest tensors of the last stage.
        ctx.shape = logits.shape
        logits = logits.reshape(-1, logits.shape[-1])
        target = target.reshape(-1)
        vmax = tp.all_reduce(logits.max(dim=-1).values.float(), op=dist.ReduceOp.MAX)
        shifted = logits.float() - vmax.unsqueeze(-1) if logits.dtype == torch.float32 else \
            logits.float().sub_(vmax.unsqueeze(-1))
        local = target - tp.rank * logits.shape[-1]
        inside = (local >= 0) & (local < logits.shape[-1])
        idx = local.clamp(0, logits.shape[-1] - 1)
        picked = shifted.gather(1, idx.unsqueeze(1)).squeeze(1) * inside
        picked = tp.all_reduce(picked)
        exp = shifted.exp_()
        sum_exp = tp.all_reduce(exp.sum(dim=-1))
        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, idx, inside)
        return (sum_exp.log() - picked).mean()

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        softmax, idx, inside = ctx.saved_tensors
        grad = softmax  # in place: the softmax is needed by this one backward only
        grad[torch.arange(len(idx)), idx] -= inside.to(grad.dtype)
        return grad.mul_(g / len(idx)).view(ctx.shape), None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    return _VocabParallelCE.apply(logits, target, tp)
