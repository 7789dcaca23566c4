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

import itertools
import math
import operator
import time
from dataclasses import dataclass
from typing import Any

from ..schedules.registry import kind
from ..spec import InfeasibleError
from .costs import CostModel, StageSpec, layers_within, micro_batches
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
    def stage_t(i: int, nl: int) -> float:
        return math.ceil(nl / spps[i]) * taus[i]

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
         tie_recompute: list[int] | None = None, prune: bool = True,
         beat: float = math.inf) -> tuple[list[tuple[float, int, list[Any]]], int]:
    """The feasible (cost, dp, config) leaves sorted by cost (ties in the order of the DFS over dps in
    order), and how many were evaluated. With `prune`, a branch whose least possible cost (_Bound) is above
    the best leaf found so far, or above `beat`, is not entered: the first leaf returned is the one the full DFS returns
    first (no leaf it skips costs as little), at a fraction of the leaves (Exp-B: 186,144 without)."""
    found: list[tuple[float, int, list[Any]]] = []
    evaluated = 0
    chips = {c.name: c for c in cm.cluster.chips}
    counts = tp_counts(cm.model)

    # per entity, the last and the first earlier entity of its type (-1: none): the group rule's TP limit
    # and the tied recompute flag
    last_of = [max((j for j in range(i) if ents[j].chip == e.chip), default=-1) for i, e in enumerate(ents)]
    first_of = [min((j for j in range(i) if ents[j].chip == e.chip), default=-1) for i, e in enumerate(ents)]
    best = beat
    # every dp's bound first; the DFS then visits the dps from the least bound up, so that a good leaf
    # comes early and prunes the rest, and ranks the leaves as the DFS in dp order finds them
    shapes = []
    for di, dp in enumerate(dps):
        if any(e.chips % dp for e in ents):
            continue
        b = micro_batches(cm.train, dp)
        opts = [[t for t in tp_sizes(chips[e.chip], *counts) if not (e.chips // dp) % t] for e in ents]
        bound = _Bound(cm, ents, opts, dp, b, group_rule, tie_recompute is not None)
        shapes.append((bound.least([], []) if prune else 0.0, di, dp, b, opts, bound))
    # a found leaf's config -> (dp index, its path: per entity the indices of its TP size and recompute flag
    # among the options), the full DFS's order of the leaves of equal cost (it visits the options in order)
    order: dict[int, tuple[int, tuple[tuple[int, int], ...]]] = {}
    limit = 1 + 1e-9
    for root, di, dp, b, opts, bound in sorted(shapes, key=lambda x: x[:2]):
        if progress:
            progress(f"h2: dp={dp} ({di + 1}/{len(dps)})")
        if prune and root > best * limit:
            continue

        # the closure is called only within this iteration, so binding dp, b, tps, rs as arguments is for
        # clarity, not correctness
        def rec(i: int, dp: int, b: int, tps: list[int], rs: list[bool], path: tuple[tuple[int, int], ...],
                opts: list[list[int]] = opts, bound: _Bound = bound, di: int = di) -> None:
            nonlocal evaluated, best
            if i == len(ents):
                evaluated += 1
                spps = [e.chips // dp // t for e, t in zip(ents, tps)]
                ls = _shard_layers(cm, ents, tps, rs, spps, dp, b, sum(spps))
                if ls is not None:
                    cost = _h2_cost(cm, ents, tps, rs, spps, ls, dp, b)
                    cfg = [list(tps), list(rs), spps, ls]
                    found.append((cost, dp, cfg))
                    order[id(cfg)] = (di, path)
                    best = min(best, cost)
                return
            # the children's bounds first, then the children from the least bound up: a good leaf comes
            # early and prunes the rest (the leaf returned is the same: see `order`)
            last, first = last_of[i], first_of[i]
            picks = [(ti, ri, t, r) for ti, t in enumerate(opts[i]) if not (group_rule and last >= 0 and t > tps[last])
                     for ri, r in enumerate((rs[first],) if tie_recompute is not None and first >= 0 else BOTH)]
            lows = bound.children(tps, rs, [(t, r) for _, _, t, r in picks]) if prune else [0.0] * len(picks)
            kids = [(low, *pick) for low, pick in zip(lows, picks)]
            kids.sort(key=lambda k: k[:3])
            for low, ti, ri, t, r in kids:
                if prune and low > best * limit:
                    break  # sorted: none after it can hold a leaf as cheap
                tps.append(t)
                rs.append(r)
                rec(i + 1, dp, b, tps, rs, (*path, (ti, ri)), opts, bound, di)
                tps.pop()
                rs.pop()

        rec(0, dp, b, [], [], ())
    found.sort(key=lambda x: (x[0], order[id(x[2])]))
    return found, evaluated


Part = tuple[float, float, int, float]  # _Bound's per entity: tau, s / tau, most layers, the level it caps at


class _Bound:
    """A lower bound on _h2_cost over every leaf below a DFS branch whose first entities have their TP sizes
    and recompute flags set; the others count at their best (least time per layer, most layers per unit of
    time and in memory, over the TP sizes and flags the DFS's rules leave them).

    With c_i = ceil(l_i / s_i) tau_i >= l_i tau_i / s_i, sum_i l_i = L and l_i <= cap_i (cap_i: s_i stages,
    each holding the fewest micro-batches any leaf's first stage holds, neither end's extra memory):
    - the largest c_i is at least the level Z where sum_i min(Z s_i / tau_i, cap_i) reaches L;
    - the total sum_i s_i c_i is at least sum_i l_i tau_i with the layers on the least tau first;
    - the cost is at least (b - 1) max_i c_i + total (updates and rounding only add)."""

    def __init__(self, cm: CostModel, ents: list[Entity], opts: list[list[int]], dp: int, b: int,
                 group_rule: bool = False, tied: bool = False) -> None:
        self.cm, self.ents, self.dp, self.b = cm, ents, dp, b
        self.group_rule, self.tied = group_rule, tied  # the DFS's rules for a type's later groups
        self.L = cm.model.layers
        sk = kind(cm.train.schedule)
        # the fewest stages any leaf below has (each later entity at its largest TP size): a floor on the
        # first stage's in-flight count, whatever the rest chooses
        fewest = [e.chips // dp // max(o, default=1) for e, o in zip(ents, opts)]
        self.rest_stages = [sum(fewest[i:]) for i in range(len(ents) + 1)]
        held = [sk.in_flight(0, q, b, {}) for q in range(1, self.L + 1)]
        floor = list(itertools.accumulate(reversed(held), min))[::-1]  # floor[q] = min(held[q:])
        self.floor, self.sk = floor, sk
        # per entity over its options: (least tau, most s / tau, most layers) at each in-flight floor n
        self.opts = opts
        self.best: dict[tuple[tuple[str, int], int, int, tuple[bool, ...]], Part] = {}
        # keyed by (chip, chips) as one value: entities of one type and size share their parts
        self.chip_of = [(e.chip, e.chips) for e in ents]
        self.seen: dict[tuple[tuple[str, int], int, bool, int], Part] = {}
        self.rest_memo: dict[tuple[Any, ...], tuple[list[Part], ...]] = {}
        # the chip types of entities k.. in order (a memo key's TP limits and flags are theirs)
        self.rest_chips = [list(dict.fromkeys(e.chip for e in ents[k:])) for k in range(len(ents) + 1)]

    def in_flight(self, p: int) -> int:
        return self.floor[p - 1] if 1 <= p <= self.L else self.sk.in_flight(0, p, self.b, {})

    def _entity(self, i: int, t: int, r: bool, n: int) -> Part:
        """(tau, s / tau, the most layers, the level its stages fill at) of entity i at (t, r)."""
        key = (self.chip_of[i], t, r, n)
        got = self.seen.get(key)
        if got is None:
            e, s = self.ents[i], self.ents[i].chips // self.dp // t
            tau = self.cm.coef(e.chip, t, r, self.dp).tau
            # CostModel.max_layers(..., n, False, False, zero1=False) from its n-free terms: most of these
            # in-flight counts are asked once, so its memo would only cost the lookups
            cap = s * layers_within(self.cm.room_terms(e.chip, t, r, self.dp, False, False, False), n)
            got = self.seen[key] = (tau, s / tau, cap, cap * tau / s)
        return got

    def _free(self, i: int, n: int, tmax: int, rs: tuple[bool, ...]) -> Part:
        co = self.chip_of[i]
        key = (co, n, tmax, rs)  # entities of one type and size have the same options
        got = self.best.get(key)
        if got is None:
            seen = self.seen
            xs = [seen.get((co, t, r, n)) or self._entity(i, t, r, n) for t in self.opts[i] if t <= tmax for r in rs]
            taus, rates, caps, _ = zip(*xs) if xs else ((math.inf,), (0.0,), (0,), ())
            tau, rate, cap = min(taus), max(rates), max(caps)
            got = self.best[key] = (tau, rate, cap, cap / rate if rate > 0 else math.inf)
        return got

    def least(self, tps: list[int], rs: list[bool]) -> float:
        """The bound below the branch whose first len(tps) entities are set (the DFS's root: none)."""
        if tps:
            return self.children(tps[:-1], rs[:-1], [(tps[-1], rs[-1])])[0]
        n, none = self.in_flight(self.rest_stages[0]), tuple(None for _ in self.rest_chips[0])
        return self._with_rest(0, n, [], (0, n, none if self.group_rule else (), none)
                               if self.group_rule or self.tied else (0, n), {}, {})

    def children(self, tps: list[int], rs: list[bool], kids: list[tuple[int, bool]]) -> list[float]:
        """least(tps + [t], rs + [r]) for each (t, r) of `kids`: the set entities' stage count, parts (per
        in-flight count) and TP limits and flags are the siblings' common prefix, computed once."""
        i, ents, dp = len(tps), self.ents, self.dp
        k, chip, size = i + 1, ents[i].chip, ents[i].chips // dp
        p0 = self.rest_stages[k]
        for e, t in zip(ents, tps):
            p0 += e.chips // dp // t
        seen, entity, chip_of = self.seen, self._entity, self.chip_of
        rules, rest_chips = self.group_rule or self.tied, self.rest_chips[k]
        last_tp0: dict[str, int] = {}  # a type's later groups: TP no larger than its last set group's
        first_r0: dict[str, bool] = {}  # and, tied, its first group's recompute flag
        if rules:
            for e, t, r in zip(ents, tps, rs):
                last_tp0[e.chip] = t
                first_r0.setdefault(e.chip, r)
        prefix: dict[int, list[Part]] = {}  # the set entities' parts at an in-flight count
        out = []
        for t, r in kids:
            n = self.in_flight(p0 + size // t)
            parts = prefix.get(n)
            if parts is None:
                # the parts of the set entities: memo hits inline (the DFS asks at every node)
                parts = prefix[n] = [seen.get((chip_of[j], tj, rj, n)) or entity(j, tj, rj, n)
                                     for j, (tj, rj) in enumerate(zip(tps, rs))]
            parts = [*parts, seen.get((chip_of[i], t, r, n)) or entity(i, t, r, n)]
            if rules:
                last_tp, first_r = {**last_tp0, chip: t}, first_r0 if chip in first_r0 else {**first_r0, chip: r}
                key: tuple[Any, ...] = (k, n, tuple(last_tp.get(c) for c in rest_chips) if self.group_rule else (),
                                        tuple(first_r.get(c) for c in rest_chips))
            else:
                last_tp, first_r, key = {}, {}, (k, n)
            out.append(self._with_rest(k, n, parts, key, last_tp, first_r))
        return out

    def _with_rest(self, k: int, n: int, parts: list[Part], key: tuple[Any, ...], last_tp: dict[str, int],
                   first_r: dict[str, bool]) -> float:
        """The bound of the set entities' `parts` with entities k.. at their best."""
        # the rest's parts depend only on this key (the DFS asks for the same ones at every sibling)
        rest_parts = self.rest_memo.get(key)
        if rest_parts is None:
            rest_parts = self.rest_memo[key] = self._rest(k, n, last_tp, first_r)
        if len(rest_parts) == 2:
            return min(_level_and_total(parts + rp, self.L, self.b) for rp in rest_parts)
        return _level_and_total(parts + rest_parts[0], self.L, self.b)

    def _rest(self, k: int, n: int, last_tp: dict[str, int], first_r: dict[str, bool]) -> tuple[list[Part], ...]:
        """The parts of entities k.. at their best (one list), or where the rest is one type whose recompute
        flag is still open, one list per flag."""
        ents, free = self.ents, self._free
        rest = range(k, len(ents))
        tmax = [last_tp.get(ents[i].chip, ANY_TP) if self.group_rule else ANY_TP for i in rest]
        left = {ents[i].chip for i in rest}
        if len(left) == 1 and (self.tied or len(rest) == 1) and not left & first_r.keys():
            # the least over that one flag, as a memory-bound type's flag trades its rate against its room
            return tuple([free(i, n, m, (r,)) for i, m in zip(rest, tmax)] for r in BOTH)
        flags = [(first_r[ents[i].chip],) if self.tied and ents[i].chip in first_r else BOTH for i in rest]
        return ([free(i, n, m, f) for i, m, f in zip(rest, tmax, flags)],)


def _level_and_total(parts: list[Part], L: int, b: int) -> float:
    """_Bound's least cost of these entities' parts (see _Bound)."""
    _, fills, caps, _ = zip(*parts)  # the same sums in the same order as over the parts, without a generator
    if sum(caps) < L:
        return math.inf
    # the level Z: entities fill at rate s / tau until their cap, in order of the level they cap at
    left, rate, z = float(L), sum(fills), 0.0
    for _, fill, _, at in sorted(parts, key=_LEVEL):
        if fill <= 0 or rate * (at - z) >= left:
            break
        left -= rate * (at - z)
        z, rate = at, rate - fill
    if rate > 0:
        z += left / rate
    total, short = 0.0, L
    for tau, _, cap, _ in sorted(parts):
        if cap >= short:
            total += short * tau
            break
        total += cap * tau
        short -= cap
    return (b - 1) * z + total


ANY_TP, BOTH = 1 << 30, (False, True)  # _Bound: no TP limit, either recompute flag
_LEVEL = operator.itemgetter(3)


def _to_stages(ents: list[Entity], cfg: list[Any]) -> list[StageSpec]:
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
              progress: Progress | None = None, prune: bool = True) -> SearchResult:
    """h2's plan. `prune`: skip the DFS branches that cannot hold its best leaf (_dfs); the plan is the same
    either way (tests/heteroauto/test_heteroauto_h2_pruning.py)."""
    t0 = time.perf_counter()
    order = sorted(cm.cluster.chips, key=lambda c: -c.memory_gb)
    ents = [Entity(c.name, c.count) for c in order]
    dps = dp_candidates(cm.cluster, cm.train)
    found, n1 = _dfs(cm, ents, dps, False, progress, prune=prune)
    if not found:
        from .infeasible import explain_infeasible
        raise InfeasibleError(explain_infeasible(cm))
    best_cost, best_dp, best_cfg = found[0]
    best_ents, n2 = ents, 0
    if two_stage:
        gents = [Entity(c.name, g) for c in order for g in groups(c, group_size)]
        if len(gents) > len(ents):
            # a leaf of the second stage wins only below the first stage's best
            found2, n2 = _dfs(cm, gents, [best_dp], True, progress, tie_recompute=[], prune=prune,
                              beat=best_cost)
            if found2 and found2[0][0] < best_cost:
                best_cost, best_dp, best_cfg = found2[0]
                best_ents = gents
    stages = _to_stages(best_ents, best_cfg)
    b = micro_batches(cm.train, best_dp)
    full = cm.evaluate(stages, best_dp, b).iteration_time_s
    cand = Candidate(full, best_dp, stages, f"h2 cost {best_cost:.4f} s")
    return SearchResult(cand, [], n1 + n2, 0, time.perf_counter() - t0)
