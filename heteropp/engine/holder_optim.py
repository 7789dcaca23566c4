"""ZeRO-1 in a plan of replica groups: each part's optimizer state sharded over every rank that holds it.

A rank of a replica group holds parts (layers, the embedding, the final norm and head) whose holders differ from
part to part (replica_groups.py: one stage of every group). After sum_holder_grads every holder of a part has
its gradient summed over all of them, so each holder steps the Adam state of its 1/holders shard of the part
and the updated shards are all-gathered over the part's holders: ZeroAdamW with the part's holder group as its
DP group, the all-reduce already done (`presummed`). One ZeroAdamW per part; fp16's overflow check and the
clipping's global norm span all of a rank's parts (optim.step_shards).

With tied embeddings the matrix is summed over every holder of either end first (HolderGroups.tie); its
optimizer is then its own, sharded over the holders of the same end: the embedding over the embedding's holders,
the head's copy over the holders of a copy (the last stages of the groups of more than one stage,
HolderGroups.copy), so every holder of a part lists the same parameters.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .optim import LossScaler, ZeroAdamW, step_shards
from .replica_groups import HolderGroups, part_of
from .tied import TIED_NAMES


def _order(bucket: int | str) -> tuple[int, int]:
    """One order of the buckets on every rank, so that collectives over groups that share ranks never wait on
    each other: the embedding, the layers, the head."""
    if isinstance(bucket, int):
        return (2, bucket)
    return ({"embed.weight": 0, "embed": 1, "head": 3, "head.weight": 4}[bucket], 0)


def buckets(names: list[str], hg: HolderGroups) -> list[tuple[list[int], Any]]:
    """This rank's parameters (by index into `names`) grouped by the ranks that hold each group, with those
    ranks' process group (None where this rank holds it alone), in `_order`. ValueError where `hg` does not
    list a part of `names`."""
    by: dict[int | str, list[int]] = {}
    for i, name in enumerate(names):
        by.setdefault(name if hg.tied and name in TIED_NAMES else part_of(name), []).append(i)
    out = []
    for b in sorted(by, key=_order):
        part = "embed" if b == "embed.weight" else b
        if b != "head.weight" and part not in hg.parts:  # stepped alone, its holders' weights would drift apart
            raise ValueError(f"parameters {[names[i] for i in by[b]]} are of part {part!r}, which this rank's "
                             f"holder groups do not list (they list {sorted(hg.parts, key=str)})")
        out.append((by[b], hg.copy if b == "head.weight" else hg.parts[part]))
    return out


class HolderAdamW:
    """The optimizer of one rank of a plan of replica groups under ZeRO-1, as ZeroAdamW's interface (step,
    zero_grad, lr, t, last_norm, scaler, full_state, load_full_state) over one ZeroAdamW per part."""

    def __init__(self, params: list[torch.nn.Parameter], names: list[str], hg: HolderGroups, lr: float, *,
                 weight_decay: float, decay: list[bool], owned: list[bool], clip_norm: float | None,
                 distributed_norm: bool, scaler: LossScaler | None) -> None:
        """`owned[i]`: whether this rank counts parameter i's gradient elements in the norm, where its shard
        holds them (as ZeroAdamW's)."""
        if clip_norm is not None and not clip_norm > 0:
            raise ValueError(f"clip_norm must be positive, got {clip_norm}")
        self.params, self.clip_norm, self.distributed_norm, self.scaler = params, clip_norm, distributed_norm, scaler
        self.last_norm: float | None = None
        self.index: list[list[int]] = []
        self.parts: list[ZeroAdamW] = []
        for idx, group in buckets(names, hg):
            rank, size = (dist.get_rank(group), dist.get_world_size(group)) if group is not None else (0, 1)
            self.index.append(idx)
            self.parts.append(ZeroAdamW([params[i] for i in idx], lr, group, rank, size, weight_decay=weight_decay,
                                        owned=[owned[i] for i in idx], decay=[decay[i] for i in idx],
                                        zero1=True, presummed=True))

    @property
    def lr(self) -> float:
        return self.parts[0].lr

    @lr.setter
    def lr(self, value: float) -> None:
        for o in self.parts:
            o.lr = value

    @property
    def t(self) -> int:
        return self.parts[0].t

    def state_elems(self) -> int:
        """Elements of Adam's first moment this rank keeps, over its parts."""
        return sum(o.m.numel() for o in self.parts)

    def zero_grad(self) -> None:
        for o in self.parts:
            o.zero_grad()

    def step(self) -> bool:
        done, norm = step_shards(self.parts, self.scaler, self.clip_norm, self.distributed_norm, None)
        if norm is not None:
            self.last_norm = norm
        return done

    def full_state(self) -> dict[str, list[torch.Tensor]]:
        """ZeroAdamW.full_state in `params` order (each part gathered over its holders: every holder calls it)."""
        out: dict[str, list[Any]] = {k: [None] * len(self.params) for k in ("master", "exp_avg", "exp_avg_sq")}
        for idx, o in zip(self.index, self.parts):
            for key, tensors in o.full_state().items():
                for i, x in zip(idx, tensors):
                    out[key][i] = x
        return out

    def load_full_state(self, master: list[torch.Tensor], exp_avg: list[torch.Tensor],
                        exp_avg_sq: list[torch.Tensor], step: int) -> None:
        for idx, o in zip(self.index, self.parts):
            o.load_full_state([master[i] for i in idx], [exp_avg[i] for i in idx], [exp_avg_sq[i] for i in idx],
                              step)
