"""One pipeline stage of the decoder: its layers, plus the embedding on the first stage and the final
norm, output head and loss on the last. With one stage and TP 1 it is the whole (reference) model."""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..plan import tp_split_error
from ..spec import ModelSpec
from .init import EMBED_LAYER
from .layers import Block, RMSNorm
from .linear import ColumnParallelLinear
from .parallel import TPGroup
from .vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy


def check_tp(m: ModelSpec, tp: int) -> str | None:
    """Why this model cannot be split over `tp` ranks, or None. The rule itself is tp_split_error, shared
    with plan validation and the planner, so a TP size the planner proposes is one this model accepts."""
    why = tp_split_error(tp, m.heads, m.kv_heads, m.ffn, m.vocab)
    return None if why is None else f"{why[0]}; expected a tp that is {why[1]}"


class StageModel(nn.Module):
    def __init__(self, m: ModelSpec, layers: range, tp: TPGroup, *, seed: int, first: bool, last: bool,
                 recompute: bool = False) -> None:
        super().__init__()
        if (why := check_tp(m, tp.size)) is not None:
            raise ValueError(why)
        self.tp, self.first, self.last, self.recompute = tp, first, last, recompute
        self.embed = VocabParallelEmbedding(m.vocab, m.hidden, tp, seed=seed, layer=EMBED_LAYER,
                                            name="embed") if first else None
        # Keys are global layer indices, so parameter names match the reference model's.
        self.layers = nn.ModuleDict({str(i): Block(m, tp, seed, i) for i in layers})
        self.tied = m.tie_embeddings
        if last:
            self.norm = RMSNorm(m.hidden, m.norm_eps)
            if self.tied and self.embed is not None:  # one stage holds both ends: one parameter
                self.head = ColumnParallelLinear(m.hidden, m.vocab, tp, seed=seed, layer=EMBED_LAYER, name="embed",
                                                 std=0.02)
                self.head.weight = self.embed.weight
            else:  # tied on another stage: a copy of the embedding, kept equal by summing both gradients
                self.head = ColumnParallelLinear(m.hidden, m.vocab, tp, seed=seed,
                                                 layer=EMBED_LAYER if self.tied else m.layers,
                                                 name="embed" if self.tied else "head", std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: token ids [b, s] on the first stage, hidden states [b, s, h] elsewhere. Returns hidden states,
        or vocab-sharded logits on the last stage."""
        if self.embed is not None:
            x = self.embed(x)
        for block in self.layers.values():
            # Non-reentrant: with reentrant checkpointing the first stage's weights get no gradient.
            x = checkpoint(block, x, use_reentrant=False) if self.recompute else block(x)
        if self.last:
            x = self.head(self.norm(x))
        return x

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_cross_entropy(logits, target, self.tp)
