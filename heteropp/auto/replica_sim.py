"""The simulated iteration time of a plan whose replica groups run different pipelines (Plan.replicas).

Each group's pipeline runs its micro-batches through the event-loop simulator (simulator.py) without the
update; a boundary's explicit link between two chip types is shared by every pipeline, of any group, that
crosses it. Then every layer (and the embedding, and the head) reduces its gradients over every rank that
holds it, in every group: a ring all-reduce over those ranks, shard by shard (a layer has one TP size in
every group; inside one node only where every group's stages, placed together, put all its holders in one
node of a type whose nodes the spec lists), that starts once the last of its holding stages has finished its
backwards. A stage runs its layers' all-reduces one after another, then its optimizer step (its ZeRO-1 shard
among those ranks); the iteration ends with the last stage's. A plan of one group is priced the same way as
plan_sim.simulate_plan prices it. A plan of replica groups is priced with its own zero1, as the engine runs it:
with ZeRO-1 each holder keeps the optimizer state of its shard of each part (engine/holder_optim.py), so a
stage's memory sums its parts' bytes, each part's state divided among all its holders; without it every holder
keeps the whole state. A tied embedding (model.tie_embeddings) is summed once over every holder of either end,
whole in fp32, then only gathered per end: the head's copy by the last stages of groups of more than one stage.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..plan import Plan
from ..schedules import kind
from ..spec.placement import StageBlock, place
from .costs import CostModel, StageSpec
from .plan_sim import latencies, plan_stages
from .simulator import simulate


@dataclass(frozen=True)
class Holder:
    """One stage of one group that holds a layer (or the embedding or head)."""
    group: int
    stage: int
    chip: str
    tp: int
    ranks: int  # per TP shard: the group's pipelines times the stage's inner replicas


@dataclass
class GroupsResult:
    iteration_time_s: float
    compute_end_s: list[list[float]]  # per group, per stage: its last compute action's end
    stage_end_s: list[list[float]]  # per group, per stage: after its all-reduces and optimizer step
    peak_memory_bytes: list[list[float]]


def simulate_groups(cm: CostModel, plan: Plan) -> GroupsResult:
    """The iteration time of `plan` (any plan; one of one group is priced as plan_sim prices it)."""
    groups = plan.groups
    if plan.replicas and cm.train.zero1 != plan.zero1:  # as the engine runs it: with the plan's zero1
        cm = CostModel(cm.cluster, cm.model, replace(cm.train, zero1=plan.zero1), cm.profile)
    if kind(plan.schedule).params:
        raise ValueError(f"schedule {plan.schedule!r}: replica groups take a schedule without parameters")
    specs = [plan_stages(g) for g in groups]
    crossing: dict[frozenset[str], int] = {}  # pipelines that cross a link between two chip types
    for g, st in zip(groups, specs):
        for pair in {frozenset((a.chip, b.chip)) for a, b in zip(st, st[1:]) if a.chip != b.chip}:
            crossing[pair] = crossing.get(pair, 0) + g.dp
    tied = bool(plan.replicas) and cm.model.tie_embeddings
    holders = _holders(groups, specs, tied)
    ends, peaks = [], []
    for i, (g, st) in enumerate(zip(groups, specs)):
        times, _ = cm.stage_times(st, g.dp)
        if plan.replicas and cm.train.zero1:  # each part's optimizer state sharded over all its holders
            times = [replace(t, static_bytes=_static(cm, holders, i, k, s)) for k, (t, s) in enumerate(zip(times, st))]
        es = [cm.boundary(a.chip, a.tp * a.inner_dp, b.chip, b.tp * b.inner_dp,
                          crossing.get(frozenset((a.chip, b.chip)), g.dp)) for a, b in zip(st, st[1:])]
        res = simulate([replace(t, update=0.0) for t in times], es, g.micro_batches, plan.schedule,
                       keep_timeline=True, latency_s=latencies(cm, st))
        done = [0.0] * len(st)
        for stage, _, _, _, end in res.timeline:
            done[stage] = max(done[stage], end)
        ends.append(done)
        peaks.append(res.peak_memory_bytes)
    nodes = _placed_nodes(cm, groups)
    # a tied matrix's gradient is summed first, over every holder of either end (the engine's tie)
    syncs: dict[int | str, list[Holder]] = {**holders, "tie": _ends(holders)} if tied else holders
    start = {part: max(ends[h.group][h.stage] for h in hs) for part, hs in syncs.items()}
    stage_end = [list(e) for e in ends]
    for part, hs in syncs.items():
        for h in hs:
            stage_end[h.group][h.stage] = max(stage_end[h.group][h.stage], start[part])
    for part, hs in syncs.items():
        ranks = sum(h.ranks for h in hs)
        chips = frozenset(h.chip for h in hs)
        placed = [nodes[h.group, h.stage] for h in hs if (h.group, h.stage) in nodes]
        one_node = len({n for w in placed for n in w}) == 1 if len(placed) == len(hs) else None
        for h in hs:
            stage_end[h.group][h.stage] += (
                cm.tie_sum(chips, h.chip, sum(x.tp * x.ranks for x in hs), one_node) if part == "tie" else
                cm.part_update(part, chips, h.chip, h.tp, ranks, one_node, summed=tied and part in ("embed", "copy")))
    t = max(max(e) for e in stage_end)
    return GroupsResult(t, ends, stage_end, peaks)


def _static(cm: CostModel, holders: dict[int | str, list[Holder]], group: int, stage: int, s: StageSpec,
            alone: bool = False) -> float:
    """Stage `stage` of group `group`'s bytes of weights, gradients and optimizer state, part by part, each part's
    state shared by all its holders (`alone`: as its group planned alone, replicas.py: by the stage's own replicas
    and one rank of each other group)."""
    groups = len({h.group for hs in holders.values() for h in hs})
    out = 0.0
    for part, hs in holders.items():
        mine = [h for h in hs if h.group == group and h.stage == stage]
        if mine:
            out += cm.part_static(part, s.tp, mine[0].ranks + groups - 1 if alone else sum(h.ranks for h in hs))
    return out


def shared_state_bytes(cm: CostModel, plan: Plan) -> list[list[float]]:
    """Per group, per stage of a plan of replica groups with ZeRO-1: the optimizer state it keeps less than when
    its group's own replicas alone share each part's (its group planned alone, replicas.py)."""
    groups = plan.groups
    specs = [plan_stages(g) for g in groups]
    holders = _holders(groups, specs, cm.model.tie_embeddings)
    return [[_static(cm, holders, i, k, s, alone=True) - _static(cm, holders, i, k, s) for k, s in enumerate(st)]
            for i, st in enumerate(specs)]


def _placed_nodes(cm: CostModel, groups: list[Plan]) -> dict[tuple[int, int], list[int]]:
    """(group, stage) -> the node of each of its TP groups, for the stages of a chip type whose nodes the
    spec lists, every group's stages placed together (spec/placement.py; PlacementError where they do not
    fit); the other stages are left out."""
    listed = {c.name: c.nodes for c in cm.cluster.chips if c.nodes}
    keys = [(i, k) for i, g in enumerate(groups) for k, s in enumerate(g.stages) if s.chip in listed]
    blocks = [StageBlock(groups[i].stages[k].chip, groups[i].stages[k].tp, groups[i].stage_dp(k)) for i, k in keys]
    return dict(zip(keys, place(listed, blocks))) if keys else {}


def _holders(groups: list[Plan], specs: list[list[StageSpec]], tied: bool = False) -> dict[int | str, list[Holder]]:
    """Per layer (its index), "embed" and "head": the stages that hold it. `tied` (the head is the embedding, as
    engine/holder_optim.py buckets it): "norm" (the final norm) on every last stage instead of "head", and
    "copy" (the head's copy of the embedding) on the last stages of groups of more than one stage only: a group
    of one stage holds the matrix once."""
    out: dict[int | str, list[Holder]] = {}
    for i, (g, st) in enumerate(zip(groups, specs)):
        for k, s in enumerate(g.stages):
            h = Holder(i, k, s.chip, s.tp, g.dp * s.inner_dp)
            for layer in s.layer_range:
                out.setdefault(layer, []).append(h)
            if k == 0:
                out.setdefault("embed", []).append(h)
            last = k == len(st) - 1
            if last and not tied:
                out.setdefault("head", []).append(h)
            if last and tied:
                out.setdefault("norm", []).append(h)
            if last and tied and k > 0:
                out.setdefault("copy", []).append(h)
    return out


def _ends(holders: dict[int | str, list[Holder]]) -> list[Holder]:
    """The stages that hold either end of a tied embedding, each once."""
    return list(dict.fromkeys(holders["embed"] + holders["norm"]))
