"""A plan whose replica groups run different pipelines (Plan.replicas) as the engine runs it.

The world's ranks are the groups' in turn: group i's ranks start where group i - 1's end, and inside a
group they are laid out as a plan of one stage list lays them out (GroupPlan.rank_offsets). Each group runs
its own pipelines on its own share of the global batch (its sequences follow the groups' before it).
Every layer, the embedding and the head (with the final norm) is held by one stage of every group; after
the backward passes each rank sums its gradients with every other rank that holds the same part at the
same TP rank (one all-reduce per part over `HolderGroups.parts`; a layer has one TP size in every group,
Plan.validate), so every holder steps the optimizer on the same total gradient and keeps the same weights.
Without ZeRO-1 the optimizer state is then whole on every holder; with it each holder keeps the state of its
shard of each part and the updated shards are all-gathered over the part's holders (holder_optim.py).
With tied embeddings the embedding and the head's copy of it are one matrix held by stage 0 and the last stage
of every group (one parameter where a group has one stage): their gradients are summed over every holder of
either (`HolderGroups.tie`, tied.py) instead of per part.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist

from ..model.grads import grad_of
from ..model.parallel import TPGroup
from ..plan import Plan
from .tied import TIED_NAMES, sum_tied_grads


@dataclass
class GroupPlan(Plan):
    """One replica group as a plan of one stage list whose ranks start at `rank_base` of the world."""

    rank_base: int = 0

    def rank_offsets(self) -> list[int]:
        return [self.rank_base + o for o in super().rank_offsets()]


def group_plans(plan: Plan) -> list[GroupPlan]:
    """The groups in rank order (their stages' estimates left out: the straggler watch reads them from the
    whole plan, every group's stages together)."""
    out, base = [], 0
    for g in plan.groups:
        stages = [replace(s, est_time_s=None, est_memory_gb=None) for s in g.stages]
        out.append(GroupPlan(stages=stages, dp=g.dp, micro_batch_size=g.micro_batch_size,
                             micro_batches=g.micro_batches, schedule=g.schedule, num_layers=g.num_layers,
                             schedule_params=g.schedule_params, rank_base=base))
        base += g.world_size
    return out


def group_of(groups: list[GroupPlan], rank: int) -> int:
    for i, g in enumerate(groups):
        if g.rank_base <= rank < g.rank_base + g.world_size:
            return i
    raise ValueError(f"rank {rank} is outside the plan's {sum(g.world_size for g in groups)} ranks")


def part_of(name: str) -> int | str:
    """The part a parameter belongs to: its layer's index, "embed", or "head" (the final norm and head)."""
    if name.startswith("layers."):
        return int(name.split(".")[1])
    return "embed" if name.startswith("embed.") else "head"


@dataclass
class HolderGroups:
    """This rank's place in a plan of replica groups."""

    index: int  # its group
    seq_base: int  # the first sequence of the global batch its group takes
    micro_batches: int  # of the whole plan, every group's pipelines together
    parts: dict[int | str, Any] = field(default_factory=dict)  # part -> the process group of its holders
    loss: Any = None  # the last stages' ranks of every group at this rank's TP rank (None off the last stage)
    tied: bool = False  # the head is the embedding: both summed over `tie`, not per part
    tie: Any = None  # every holder of the embedding or the head, in every group (None where this rank holds neither)
    # tied: the holders of the head's copy of the embedding at this rank's TP rank (the last stages of the groups
    # of more than one stage), whose ZeRO-1 shards it splits into (holder_optim.py); None where not held or alone
    copy: Any = None


def _holders(groups: list[GroupPlan]) -> dict[tuple[int | str, int], list[int]]:
    """(part, TP rank) -> every rank that holds that shard, group by group."""
    out: dict[tuple[int | str, int], list[int]] = {}
    for g in groups:
        last = len(g.stages) - 1
        for k, s in enumerate(g.stages):
            parts: list[int | str] = [*s.layer_range, *(["embed"] if k == 0 else []), *(["head"] if k == last else [])]
            for part in parts:
                for t in range(s.tp):
                    out.setdefault((part, t), []).extend(
                        g.rank_offsets()[k] + d * s.tp + t for d in range(g.stage_dp(k)))
    return out


def _last_ranks(groups: list[GroupPlan], copies: bool = False) -> list[list[int]]:
    """Per TP rank of the last stages: the ranks of every group's last stage at it; `copies`: only of the groups
    of more than one stage (the holders of a tied embedding's copy as their head)."""
    out: dict[int, list[int]] = {}
    for g in groups:
        k = len(g.stages) - 1
        if k > 0 or not copies:
            for d in range(g.stage_dp(k)):
                for t in range(g.stages[k].tp):
                    out.setdefault(t, []).append(g.rank_offsets()[k] + d * g.stages[k].tp + t)
    return [out[t] for t in sorted(out)]


def build_holder_groups(plan: Plan, groups: list[GroupPlan], rank: int, backend: str,
                        timeout_s: float, tied: bool = False) -> HolderGroups:
    """Every rank creates every holder group in the same order (torch requires it) and keeps its own; the
    holders span chip types, so they use the point-to-point backend. `tied`: the model's head is its embedding."""
    timeout = datetime.timedelta(seconds=timeout_s)
    index = group_of(groups, rank)
    made: dict[tuple[int, ...], Any] = {}
    mine = HolderGroups(index, sum(g.global_batch for g in groups[:index]),
                        plan.global_batch // plan.micro_batch_size, tied=tied)
    holders = _holders(groups)
    if tied:
        ends = sorted({r for (part, _), ranks in holders.items() if part in ("embed", "head") for r in ranks})
        pg = dist.new_group(ends, backend=backend, timeout=timeout)
        mine.tie = pg if rank in ends else None
        for ranks in _last_ranks(groups, copies=True):
            pg = dist.new_group(ranks, backend=backend, timeout=timeout) if len(ranks) > 1 else None
            if rank in ranks:
                mine.copy = pg
    for (part, _), ranks in sorted(holders.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        key = tuple(ranks)
        if key not in made:
            made[key] = dist.new_group(list(key), backend=backend, timeout=timeout) if len(key) > 1 else None
        if rank in key:
            mine.parts[part] = made[key]
    for ranks in _last_ranks(groups):
        pg = dist.new_group(ranks, backend=backend, timeout=timeout)
        if rank in ranks:
            mine.loss = pg
    return mine


def sum_holder_grads(named: list[tuple[str, torch.nn.Parameter]], hg: HolderGroups, tp: TPGroup) -> None:
    """Each parameter's gradient summed over every rank that holds it, in place (the optimizer's buffer):
    one all-reduce per part, its parameters' gradients side by side (as replica_sim prices it). Every
    holder lists a part's parameters in the same order (the model's), and the parts in the same order.
    Tied ends are summed first, over every holder of either (`tp`: this rank's TP group, for their slices)."""
    if hg.tie is not None:
        sum_tied_grads(named, hg.tie, tp, keep=True)
    by_part: dict[int | str, list[torch.Tensor]] = {}
    for name, p in named:
        if hg.parts.get(part_of(name)) is not None and not (hg.tied and name in TIED_NAMES):
            by_part.setdefault(part_of(name), []).append(grad_of(p))
    for part, grads in by_part.items():
        buf = torch.cat([g.reshape(-1).float() for g in grads])
        dist.all_reduce(buf, group=hg.parts[part])
        for g, piece in zip(grads, buf.split([g.numel() for g in grads])):
            g.copy_(piece.view_as(g))
