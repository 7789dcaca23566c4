"""Plans whose replicas run different pipelines (issue 30 item 4; HexiScale S3, HetAuto's outer x inner):
the chip types split into groups, each group planned alone as its own replicas with its share of the
global batch, the groups' plans joined into one plan (Plan.replicas) and priced by replica_sim.

A split is every partition of the chip types into two groups or more (at most MAX_TYPES types: Bell
numbers grow fast). Each group is first planned with the whole global batch; its share is then in
proportion to its throughput (micro-batches per second at that plan), rounded to whole micro-batches
(largest remainders), and moved one micro-batch at a time between groups while that makes the joined plan
faster. Groups whose plans give one layer different TP sizes cannot be joined (a layer's gradients are
reduced shard by shard), and are skipped.

The engine trains such plans (engine/replica_groups.py; with ZeRO-1, checkpoints and tied embeddings, and an
elastic run re-plans them with best_per_replica); `heteroauto plan --per-replica` offers them, and only then.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Iterator

from ..plan import Plan, ReplicaGroup, StagePlan
from ..schedules import kind
from ..spec import InfeasibleError, SpecError
from .baselines import sub_cluster
from .front_door import Budget, plan
from .planning import Problem, make_problem
from .replica_sim import shared_state_bytes, simulate_groups

MAX_TYPES = 5  # 52 partitions of the types at most
MAX_MOVES = 16  # micro-batches moved between groups, one at a time, while that is faster


def partitions(items: list[str]) -> Iterator[list[list[str]]]:
    """Every partition of `items` into non-empty groups (in a fixed order)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for p in partitions(rest):
        yield [[first], *p]
        for i in range(len(p)):
            yield [*p[:i], [first, *p[i]], *p[i + 1:]]


def best_per_replica(pb: Problem, budget: Budget | None = None) -> Plan | None:
    """The fastest joined plan over every split of the chip types into two groups or more, its time the
    replica simulator's (None where no split gives one, or the cluster has one type or more than MAX_TYPES,
    or the schedule takes parameters)."""
    names = [c.name for c in pb.cluster.chips]
    if len(names) < 2 or len(names) > MAX_TYPES or kind(pb.train.schedule).params:
        return None
    budget = budget or Budget(baselines=False)
    best: Plan | None = None
    for split in partitions(names):
        if len(split) < 2:
            continue
        got = _join_split(pb, split, budget)
        if got is not None and (best is None or got.iteration_time_s < best.iteration_time_s):  # type: ignore[operator]
            best = got
    return best


def _group_plan(pb: Problem, types: list[str], micro_batches: int, budget: Budget, others: int) -> Plan | None:
    """The plan of the chip types `types` alone with `micro_batches` of the global batch, or None; `others`: the
    other groups of the split."""
    cl = sub_cluster(pb.cluster, {c.name: c.count for c in pb.cluster.chips if c.name in types})
    # with the spec's zero1; under ZeRO-1 a part's optimizer state is shared by the group's own replicas and one
    # rank of each other group (each holds the whole model, a layer at one TP size in every group), as in the
    # joined plan, save a tied embedding's copy, which a group of one stage does not hold (_joined checks)
    train = replace(pb.train, global_batch=micro_batches * pb.train.micro_batch_size)
    try:
        return plan(make_problem(cl, pb.model, train, pb.cm.profile, others, _elsewhere(pb, types)), budget).plan
    except (InfeasibleError, SpecError):
        return None


def _elsewhere(pb: Problem, types: list[str]) -> tuple[float, float | None]:
    """How the joined plan's gradient rings reach the other groups from `types` (CostModel's `elsewhere`): the
    slowest network of every type, and the slowest link between these types and the others (None: none)."""
    cl = pb.cluster
    links = [bw for a in types for b in (c.name for c in cl.chips) if b not in types
             if (bw := cl.link_bw(a, b)) is not None]
    return min(c.network_bw for c in cl.chips), min(links, default=None)


def _planned(pb: Problem, types: list[str], micro_batches: int, budget: Budget, others: int,
             planned: dict[tuple[tuple[str, ...], int], Plan | None]) -> Plan | None:
    """_group_plan, each (types, share) planned once per split: the share search and its last pass ask again."""
    key = (tuple(types), micro_batches)
    if key not in planned:
        planned[key] = _group_plan(pb, types, micro_batches, budget, others)
    return planned[key]


def _join_split(pb: Problem, split: list[list[str]], budget: Budget) -> Plan | None:
    total = pb.train.micro_batches_total
    if total < len(split):
        return None
    planned: dict[tuple[tuple[str, ...], int], Plan | None] = {}  # (types, share) -> the group's plan alone
    whole = [_planned(pb, types, total, budget, len(split) - 1, planned) for types in split]
    if any(p is None or not p.iteration_time_s for p in whole):
        return None
    seen: dict[tuple[str, ...], list[tuple[list[StagePlan], int]]] = {}  # each group's plans so far (_joined)
    for types, p in zip(split, whole):
        seen[tuple(types)] = [(p.stages, p.dp)]  # type: ignore[union-attr]
    rates = [total / p.iteration_time_s for p in whole]  # type: ignore[union-attr,operator]
    shares = _rounded([total * r / sum(rates) for r in rates], total)
    cache: dict[tuple[int, ...], Plan | None] = {}

    def joined(sh: tuple[int, ...]) -> Plan | None:
        if sh not in cache:
            cache[sh] = _joined(pb, split, sh, budget, seen, planned) if min(sh) >= 1 else None
        return cache[sh]

    cur = tuple(shares)
    best = joined(cur)
    for _ in range(MAX_MOVES):
        if best is None:
            break
        moves = [tuple(n + (i == a) - (i == b) for i, n in enumerate(cur))
                 for a in range(len(cur)) for b in range(len(cur)) if a != b]
        timed = [(p.iteration_time_s, m) for m in moves if (p := joined(m)) is not None]
        if not timed or min(timed)[0] >= best.iteration_time_s:  # type: ignore[operator]
            break
        cur = min(timed)[1]
        best = joined(cur)
    # a group's plan first found at a later share may join better at an earlier one: each share visited, again
    for sh in [sh for sh, p in cache.items() if p is not None]:
        again = _joined(pb, split, sh, budget, seen, planned)
        if again is not None and (best is None or again.iteration_time_s < best.iteration_time_s):  # type: ignore[operator]
            best = again
    return best


def _rounded(exact: list[float], total: int) -> list[int]:
    """Whole micro-batches summing to `total`, at least one each, by largest remainders."""
    out = [max(1, math.floor(x)) for x in exact]
    order = sorted(range(len(exact)), key=lambda i: (out[i] - exact[i], i))
    i = 0
    while sum(out) < total:
        out[order[i % len(order)]] += 1
        i += 1
    while sum(out) > total:  # the groups raised to one micro-batch took it from the others (total >= groups)
        j = max((k for k in range(len(out)) if out[k] > 1), key=lambda k: (out[k] - exact[k], -k))
        out[j] -= 1
    return out


def _joined(pb: Problem, split: list[list[str]], shares: tuple[int, ...], budget: Budget,
            seen: dict[tuple[str, ...], list[tuple[list[StagePlan], int]]] | None = None,
            planned: dict[tuple[tuple[str, ...], int], Plan | None] | None = None) -> Plan | None:
    """Each group planned with its share, joined; None where a group has no plan or the groups disagree
    on a layer's TP size. `seen`: per group (its types), the plans it was given at other shares, which it also
    tries at this one where their dp divides it, one group at a time, keeping a faster join: a group planned
    alone cannot see what its plan costs the others (their layers' rings across the link grow with its
    holders), so its best plan alone is not always its best in the join."""
    groups = []
    for types, n in zip(split, shares):
        p = _planned(pb, types, n, budget, len(split) - 1, {} if planned is None else planned)
        if p is None:
            return None
        groups.append(ReplicaGroup(p.stages, p.micro_batches, p.dp))
        if seen is not None and (p.stages, p.dp) not in (mine := seen.setdefault(tuple(types), [])):
            mine.append((p.stages, p.dp))
    best = _priced_join(pb, groups)
    for i, (types, n) in enumerate(zip(split, shares)):
        for stages, dp in (seen or {}).get(tuple(types), []):
            if n % dp or (stages, dp) == (groups[i].stages, groups[i].dp):
                continue
            alt = [*groups[:i], ReplicaGroup(stages, n // dp, dp), *groups[i + 1:]]
            got = _priced_join(pb, alt)
            if got is not None and (best is None or got.iteration_time_s < best.iteration_time_s):  # type: ignore[operator]
                best, groups = got, alt
    return best


def _priced_join(pb: Problem, groups: list[ReplicaGroup]) -> Plan | None:
    """The groups joined and simulated (replica_sim); None where the join is invalid or a stage does not fit."""
    joined = _join(pb, groups)
    if joined.zero1:  # each stage's memory estimate as joined: its parts' state shared by every group's holders
        joined = _join(pb, [_less_state(g, saved) for g, saved in zip(groups, shared_state_bytes(pb.cm, joined))])
    try:
        joined.validate(num_layers=pb.model.layers, available={c.name: c.count for c in pb.cluster.chips},
                        nodes={c.name: c.nodes for c in pb.cluster.chips if c.nodes})
    except SpecError:
        return None
    sim = simulate_groups(pb.cm, joined)
    # a group planned alone may have counted on more sharing than the join has (a tied embedding's copy, held
    # only by the last stages of groups of more than one stage): a stage that no longer fits refuses the join
    if any(peak > pb.cluster.chip(st.chip).usable_bytes
           for g, peaks in zip(joined.replicas, sim.peak_memory_bytes) for st, peak in zip(g.stages, peaks)):
        return None
    joined.iteration_time_s = sim.iteration_time_s
    return joined


def _join(pb: Problem, groups: list[ReplicaGroup]) -> Plan:
    return Plan.of_replicas(groups, pb.train.micro_batch_size, schedule=pb.train.schedule, model=pb.model.name,
                            num_layers=pb.model.layers, algo="per-replica", zero1=pb.train.zero1)


def _less_state(g: ReplicaGroup, saved: list[float]) -> ReplicaGroup:
    """`g` with each stage's memory estimate less `saved` bytes (per stage)."""
    stages = [replace(st, est_memory_gb=None if st.est_memory_gb is None else round(st.est_memory_gb - b / 1e9, 3))
              for st, b in zip(g.stages, saved)]
    return replace(g, stages=stages)


def describe(p: Plan) -> str:
    """A plan of replica groups as lines of text: each group's pipelines, micro-batches and stages."""
    rows = []
    for i, g in enumerate(p.groups):
        stages = " | ".join(f"{s.chip} tp{s.tp} layers {s.first_layer}-{s.first_layer + s.layers - 1}"
                            + (" rc" if s.recompute else "") for s in g.stages)
        rows.append(f"group {i}: dp={g.dp} micro-batches={g.micro_batches} x {p.micro_batch_size}: {stages}")
    rows.append(f"replica groups, schedule={p.schedule} chips={p.chips_used()}: simulated iteration time "
                f"{p.iteration_time_s or 0:.4f} s")
    return "\n".join(rows)
