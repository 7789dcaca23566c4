"""`--algo h2`: the H2 paper's HeteroAuto (section 4.3), reproduced as the baseline.

DFS over s_dp and, per chip type in descending memory order, s_tp (powers of two up to TP_MAX) and the
recompute flag r_i, with N_i = s_pp,i * s_tp,i * s_dp; layers per type by the equal-compute heuristic with
iterative refinement under the memory limit; cost T = max_i(b T_i + T_i^upd + alpha sum_{j != i} T_j)
with T_i = ceil(l_i / s_pp,i) * (t_fwd + t_bwd + r_i t_recomp), alpha = 1 (1F1B). Its memory check is
schedule-unaware (every stage holds min(s_pp, b) micro-batches, as the first stage of 1F1B does) and does
not shard optimizer state. Two-stage refinement: fix the stage-one s_dp, split each type into groups of
128 chips, each an entity with its own s_tp (s_tp,a >= s_tp,b when group a precedes group b of one type)
and rerun the DFS; recompute stays per type as in 4.3.1.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ..schedules.registry import kind
from ..spec import InfeasibleError
from .costs import CostModel, StageSpec, micro_batches
from .candidates import Candidate, Progress, SearchResult
from .space import dp_candidates, groups, tp_counts, tp_sizes

ALPHA = 1.0


@dataclass(frozen=True)
class Entity:
    chip: str
    chips: int  # chips of this entity across all replicas


def _shard_layers(cm: CostModel, ents: list[Entity], tps: list[int], rs: list[bool], spps: list[int],
                  dp: int, b: int, p_total: int) -> list[int] | None:
    """Equal-compute initial layer assignment, then +-1 refinement until the total is L and memory holds."""
    L = cm.model.layers
    taus = [cm.coef(e.chip, t, r, dp).tau for e, t, r in zip(ents, tps, rs)]
    n = kind(cm.train.schedule).in_flight(0, p_total, b, {})  # the first stage holds the most
    last = len(ents) - 1
    caps = [s * cm.max_layers(e.chip, t, r, dp, n, i == 0, i == last, zero1=False)
            for i, (e, t, r, s) in enumerate(zip(ents, tps, rs, spps))]
    if any(c < s for c, s in zip(caps, spps)) or sum(caps) < L or p_total > L:
        return None
    w = [s / tau for s, tau in zip(spps, taus)]
    ls = [min(c, max(s, round(L * x / sum(w)))) for c, s, x in zip(caps, spps, w)]
    stage_t = lambda i, nl: math.ceil(nl / spps[i]) * taus[i]  # noqa: E731
    while sum(ls) > L:
        i = max((i for i in range(len(ls)) if ls[i] > spps[i]), key=lambda i: stage_t(i, ls[i]))
        ls[i] -= 1
    while sum(ls) < L:
        cand = [i for i in range(len(ls)) if ls[i] < caps[i]]
        if not cand:
            return None
        i = min(cand, key=lambda i: stage_t(i, ls[i] + 1))
        ls[i] += 1
    return ls


def _h2_cost(cm: CostModel, ents: list[Entity], tps: list[int], rs: list[bool], spps: list[int],
             ls: list[int], dp: int, b: int) -> float:
    comp, upd = [], []
    for e, t, r, s, nl in zip(ents, tps, rs, spps, ls):
        c = cm.coef(e.chip, t, r, dp)
        per = math.ceil(nl / s)
        comp.append(per * c.tau)
        upd.append(per * c.upd)
    total = sum(s * c for s, c in zip(spps, comp))
    return max(b * c + u + ALPHA * (total - c) for c, u in zip(comp, upd))


def _dfs(cm: CostModel, ents: list[Entity], dps: list[int], group_rule: bool, progress: Progress | None,
         tie_recompute: list[int] | None = None) -> tuple[list[tuple[float, int, list]], int]:
    """Return all feasible (cost, dp, config) leaves sorted, and how many were evaluated."""
    found: list[tuple[float, int, list]] = []
    evaluated = 0
    chips = {c.name: c for c in cm.cluster.chips}
    for di, dp in enumerate(dps):
        b = micro_batches(cm.train, dp)
        if progress:
            progress(f"h2: dp={dp} ({di + 1}/{len(dps)})")
        if any(e.chips % dp for e in ents):
            continue
        # the closure is called only within this iteration, so binding dp, b, tps, rs as arguments is for
        # clarity, not correctness
        def rec(i: int, dp: int, b: int, tps: list[int], rs: list[bool]) -> None:
            nonlocal evaluated
            if i == len(ents):
                evaluated += 1
                spps = [e.chips // dp // t for e, t in zip(ents, tps)]
                ls = _shard_layers(cm, ents, tps, rs, spps, dp, b, sum(spps))
                if ls is not None:
                    found.append((_h2_cost(cm, ents, tps, rs, spps, ls, dp, b), dp, [list(tps), list(rs), spps, ls]))
                return
            e = ents[i]
            prev = [tps[j] for j in range(i) if ents[j].chip == e.chip]
            for t in tp_sizes(chips[e.chip], *tp_counts(cm.model)):
                if (e.chips // dp) % t or (group_rule and prev and t > prev[-1]):
                    continue
                same = [rs[j] for j in range(i) if ents[j].chip == e.chip] if tie_recompute is not None else []
                for r in ([same[0]] if same else [False, True]):
                    tps.append(t), rs.append(r)
                    rec(i + 1, dp, b, tps, rs)
                    tps.pop(), rs.pop()

        rec(0, dp, b, [], [])
    found.sort(key=lambda x: x[0])
    return found, evaluated


def _to_stages(ents: list[Entity], cfg: list) -> list[StageSpec]:
    tps, rs, spps, ls = cfg
    out = []
    for e, t, r, s, nl in zip(ents, tps, rs, spps, ls):
        base, extra = divmod(nl, s)
        # the extra layers go to the later stages, which hold fewer micro-batches under 1F1B
        out += [StageSpec(e.chip, t, base + (1 if k >= s - extra else 0), r) for k in range(s)]
    return out


def h2_candidates(cm: CostModel, dp: int, runs: list[tuple[str, int, int]], group_size: int) -> list[Candidate]:
    """h2's plans for fixed dp and TP sizes: with whole types as entities, and with its 128-chip groups
    (the two-stage refinement) where each group has one TP size."""
    grouped: list[tuple[str, int, int]] = []
    for chip in dict.fromkeys(c for c, _, _ in runs):
        tps = [t for c, t, s in runs if c == chip for _ in range(s)]
        for g in groups(cm.cluster.chip(chip), group_size):
            left, take = g // dp, []
            while left > 0 and tps:
                take.append(tps.pop(0))
                left -= take[-1]
            if left or len(set(take)) != 1:
                grouped = []
                break
            grouped.append((chip, take[0], len(take)))
        else:
            continue
        break
    out = [h2_candidate(cm, dp, r) for r in (runs, grouped) if r]
    return [c for c in out if c is not None]


def h2_candidate(cm: CostModel, dp: int, runs: list[tuple[str, int, int]]) -> Candidate | None:
    """What h2 would plan for fixed dp and per-entity (chip, tp, stages) runs: its type order (memory
    descending), its per-type recompute choice under its own cost, its layer sharding; None when that
    does not fit the full memory model."""
    import itertools
    rank = {c.name: i for i, c in enumerate(sorted(cm.cluster.chips, key=lambda c: -c.memory_gb))}
    runs = sorted(runs, key=lambda r: rank[r[0]])  # stable: a type's groups keep their order
    ents = [Entity(c, s * t * dp) for c, t, s in runs]
    tps, spps = [t for _, t, _ in runs], [s for _, _, s in runs]
    types = list(dict.fromkeys(c for c, _, _ in runs))
    b = micro_batches(cm.train, dp)
    best = None
    for flags in itertools.product((False, True), repeat=len(types)):
        rs = [flags[types.index(c)] for c, _, _ in runs]
        ls = _shard_layers(cm, ents, tps, rs, spps, dp, b, sum(spps))
        if ls is not None:
            cost = _h2_cost(cm, ents, tps, rs, spps, ls, dp, b)
            if best is None or cost < best[0]:
                best = (cost, [tps, rs, spps, ls])
    if best is None:
        return None
    stages = _to_stages(ents, best[1])
    est = cm.evaluate(stages, dp, b)
    return Candidate(est.iteration_time_s, dp, stages, f"h2 sharding dp={dp}") if est.feasible else None


def search_h2(cm: CostModel, group_size: int = 128, two_stage: bool = True,
              progress: Progress | None = None) -> SearchResult:
    t0 = time.perf_counter()
    order = sorted(cm.cluster.chips, key=lambda c: -c.memory_gb)
    ents = [Entity(c.name, c.count) for c in order]
    dps = dp_candidates(cm.cluster, cm.train)
    found, n1 = _dfs(cm, ents, dps, False, progress)
    if not found:
        from .infeasible import explain_infeasible
        raise InfeasibleError(explain_infeasible(cm))
    best_cost, best_dp, best_cfg = found[0]
    best_ents, n2 = ents, 0
    if two_stage:
        gents = [Entity(c.name, g) for c in order for g in groups(c, group_size)]
        if len(gents) > len(ents):
            found2, n2 = _dfs(cm, gents, [best_dp], True, progress, tie_recompute=[])
            if found2 and found2[0][0] < best_cost:
                best_cost, best_dp, best_cfg = found2[0]
                best_ents = gents
    stages = _to_stages(best_ents, best_cfg)
    b = micro_batches(cm.train, best_dp)
    full = cm.evaluate(stages, best_dp, b).iteration_time_s
    cand = Candidate(full, best_dp, stages, f"h2 cost {best_cost:.4f} s")
    return SearchResult(cand, [], n1 + n2, 0, time.perf_counter() - t0)
