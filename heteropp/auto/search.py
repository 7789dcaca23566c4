"""`--algo auto`: exact best-first search over data parallelism, the order of chip types along the pipeline,
per-group TP sizes, per-stage layer counts and recompute, under the full cost model (costs.py).

Three levels of bounds, each below the next, feed one typed frontier (frontier.py; dpspace.py builds the
bounds, levels.py computes the tight ones for many rows at once with numpy):
1. every combination of per-type TP choices at every dp gets a cheap order-free bound; they enter the
   frontier in chunks, in increasing cheap bound;
2. a popped chunk gives its combinations the tight order-free bound (integral caps with recompute, the
   least fill and update level at each bottleneck level);
3. a popped combination gives each order of chip types the same bound on its exact stage sequence (end
   stages, in-flight counts, links, drain gaps), and a popped order gets the exact layer split (split.py).
Incumbents are found first (the best-bounded order of the combination with the least tight bound, and of
each other dp's most promising combination where its pipeline is short) so that every tight bound is
computed against the best of them. The search stops when no bound beats the best plan: the result is the
optimum of the cost model.
"""
from __future__ import annotations

import itertools
import math
import time
from typing import Any, Callable, TypeVar
from dataclasses import replace

import numpy as np

from ..schedules import kind
from ..spec import InfeasibleError
from .accuracy import objective_widen
from .costs import CostModel, StageSpec, micro_batches
from .candidates import Candidate, NothingFaster, Progress, SearchResult
from .dpspace import DpSpace, cheap_bounds, type_choices
from .frontier import Chunk, Entry, Frontier, Level
from .h2 import h2_candidates
from .infeasible import explain_infeasible
from .inner_dp import with_inner_dp
from .levels import bound_parts
from .idle import search_idle
from .problem import Problem
from .ranking import Ranking
from .limits import BOUND_CELLS_PER_UNIT, DEFAULT_LIMITS, IDLE_MODES, Limits, relaxed_bound, trim_choices, type_orders
from .space import dp_candidates, tp_counts, tp_sizes
from .split import best_split
from .stageopts import stage_opts

class _Top:
    """The best plans by the objective (the simulator re-ranks those within a relative `slack` of the
    best), and the incumbent: the plan with the least full time (round trips priced, the time it reports).

    `cut(dp)` prunes: a plan of that dp whose objective is at least it cannot run faster than the incumbent,
    because the objective overprices a plan's full time by at most the factor `widen[dp]`
    (accuracy.objective_widen). The objective alone is no bound of the full time: it leaves round trips out
    (a 1 ms link's, HARP Setting 1: objective 0.885 s, simulated 1.23 s), so pruning at the best objective
    dropped faster plans.

    The factor grows with the plan's stage count p: `stretch(dp, p)`. Where the caller knows the stage count
    of what it prunes (a combination of TP choices fixes it), `cut(dp, p)` uses it; otherwise the most
    stages the dp allows, `pmax[dp]` (`widen[dp]`, `beyond[dp]`)."""

    def __init__(self, keep: int, stretch: Callable[[int, int], float], pmax: dict[int, int], priced: bool,
                 beat_s: float = math.inf) -> None:
        self.keep, self.slack, self.pmax, self.priced, self.beat_s = keep, 0.0, pmax, priced, beat_s
        self._stretch = stretch
        self._at: dict[tuple[int, int], tuple[float, float]] = {}  # (dp, p) -> (widen, beyond)
        self.widen = {dp: self.factors(dp)[0] for dp in pmax}
        # per dp, the objective from which a plan cannot beat the caller's `beat_s` (search_auto)
        self.beyond = {dp: self.factors(dp)[1] for dp in pmax}
        self.items: list[Candidate] = []
        self.fastest: Candidate | None = None
        self.fastest_s = math.inf  # its full estimate

    def factors(self, dp: int, p: int | None = None) -> tuple[float, float]:
        """(widen, beyond) for plans of `p` stages at dp (at most pmax[dp] when None)."""
        key = (dp, self.pmax[dp] if p is None else min(p, self.pmax[dp]))
        got = self._at.get(key)
        if got is None:
            w = self._stretch(*key)
            got = self._at[key] = (w if self.priced else 1.0, self.beat_s * w if math.isfinite(self.beat_s)
                                   else math.inf)
        return got

    def _own(self) -> float:
        return self.items[0].time_s * (1 + self.slack) if self.items else math.inf

    def cut(self, dp: int, p: int | None = None) -> float:
        widen, beyond = self.factors(dp, p)
        own = self._own()
        own = max(own, self.fastest_s * widen) if self.fastest is not None else own
        return min(own, beyond)

    @property
    def bound(self) -> float:
        """The loosest cut over every dp."""
        own = min(self._own(), max(self.beyond.values(), default=math.inf))
        return max([own, *(self.cut(dp) for dp in self.widen)])

    def add(self, c: Candidate) -> None:
        self.items.append(c)
        self.items.sort(key=lambda x: x.time_s)
        del self.items[self.keep:]

    def offer(self, c: Candidate, full_s: float) -> None:
        if full_s < self.fastest_s:
            self.fastest, self.fastest_s = c, full_s

    def kept(self) -> list[Candidate]:
        """The plans by objective, the incumbent with them where the objective ranked it out."""
        if self.fastest is None or any(c is self.fastest for c in self.items):
            return list(self.items)
        return [*self.items, self.fastest]


CHUNK = 16  # combinations per first tight-bound batch of a dp (then doubling)
FREE_REFINE = 3
START_STAGES = 32  # start(): another dp's head is split first when it has at most this many stages (cheap)
BATCH = 16  # heap entries of one kind bounded together: a numpy pass costs about the same for 1 or 16
RERANK_SLACK = 0.01  # plans within 1% of the model's optimum are near-ties the model cannot separate
RERANK_SLACK_SMALL = 0.10  # short pipelines with few micro-batches: the model is up to ~9% pessimistic
RERANK_KEEP = 8
# the near-tie margin's second phase runs where half the kept plans, each as long as the optimum, stay within
# these stage x micro-batch pairs: the model is loose only for short, few-micro-batch pipelines
RERANK_MAX_ACTIONS = 4_000
FULL_PRICING_ACTIONS = 5_000  # stage x micro-batch pairs up to which the search prunes by full times (_priceable)
FULL_PRICING_CHIPS = 512


class BestFirst:
    """The best-first search over one frontier (frontier.py) of three levels, each bound below the next:
    chunks of TP combinations in increasing cheap bound, combinations with their tight order-free bound, and
    orders of chip types with their exact bound, whose pop gets the exact layer split. The plans go to `top`
    (_Top: the best by objective and the incumbent by full time, whose cuts prune); the work done is counted
    in units of limits.BOUND_CELLS_PER_UNIT (`work`), never seconds, so the same inputs stop at the same
    state on any machine under any load. Only the optional wall-clock cap (`deadline`) does not."""

    def __init__(self, cm: CostModel, names: list[str], orders: list[tuple[int, ...]], top: _Top,
                 widen: dict[int, float], priced: bool, near_margin: float, limits: Limits, deadline: float,
                 bounded: list[str], progress: Progress | None) -> None:
        self.cm, self.L, self.names, self.orders = cm, cm.model.layers, names, orders
        self.top, self.widen, self.priced = top, widen, priced
        self.near_margin = near_margin  # the second phase keeps what falls within it of the optimum
        self.limits, self.deadline, self.progress = limits, deadline, progress
        self.bounded = bounded  # the caller's list of the limits that cut the space: appended to
        self.frontier = Frontier()
        self.done: set[tuple[int, tuple[int, ...], bytes]] = set()
        self.evaluated = self.pruned = self.work = 0
        self.open_bound: float | None = None  # where the budget stopped the search: the least bound left open

    def later(self, e: Entry) -> bool:
        """Worth keeping: may beat the incumbent, or (for the second phase) within the re-rank margin."""
        top, p = self.top, _stages(e)
        if not top.items:
            return e.bound < top.cut(e.space.dp, p)
        near = top.items[0].time_s * (1 + self.near_margin)
        return bool(e.bound < min(max(top.cut(e.space.dp, p), near), top.factors(e.space.dp, p)[1]))

    def refine_to(self) -> float:
        """Up to where the orders' bound pass (expand) refines its rows: the loosest cut, or where the second
        phase will collect what falls within near_margin of the best plan, that margin's top (an order whose
        refinement stopped below it is split there, mostly for nothing: calibrated Exp-C-1, whose start finds
        the optimum, 632 -> 392 work units). The combinations' pass keeps the cut: refined towards a higher
        target its grid is coarser, and Exp-A-1 bounded more of them (479 -> 610 units)."""
        top = self.top
        if not top.items or not self.near_margin:
            return top.bound
        return min(max(top.bound, top.items[0].time_s * (1 + self.near_margin)), max(top.beyond.values()))

    def push(self, e: Entry) -> None:
        if self.later(e):
            self.frontier.push(e)
        else:
            self.pruned += 1

    def split(self, space: DpSpace, order: tuple[int, ...], combo: np.ndarray) -> None:
        """The exact layer split of one order of one combination, offered to `top`."""
        cm, top = self.cm, self.top
        sig = (space.dp, order, combo.tobytes())
        if sig in self.done:
            return
        runs = [(self.names[i], t, s) for i in order for t, s in space.choices[i][combo[i]]]
        seq = [(c, t) for c, t, s in runs for _ in range(s)]
        opts, lam, const = stage_opts(cm, seq, space.dp, space.b)
        self.evaluated += 1
        self.work += len(seq)
        bound = top.cut(space.dp, len(seq))
        res = best_split(opts, self.L, lam, const, bound)
        if res is None:  # nothing below `bound`: that is its lower bound for the second phase
            if math.isfinite(bound):
                self.push(Entry(bound, Level.ORDER, space, combo, order))
            return
        self.done.add(sig)
        stages = [StageSpec(ch, t, nl, r) for (ch, t), nl, r in zip(seq, res.layers, res.recompute)]
        label = f"dp={space.dp} " + " ".join(f"{c}:tp{t}x{s}" for c, t, s in runs)
        cand = Candidate(res.total, space.dp, stages, label)
        top.add(cand)
        if self.priced and res.total < top.fastest_s * self.widen[space.dp]:  # its full time may beat the incumbent's
            full = cm.evaluate(stages, space.dp, space.b, round_trips=True).iteration_time_s
            self.work += len(stages)
            top.offer(cand, full)
        if self.progress and self.evaluated % 200 == 0:
            self.progress(f"{self.evaluated} configurations split, best {top.items[0].time_s:.3f} s")

    def expand(self, items: list[tuple[DpSpace, np.ndarray]]) -> None:
        """Bound every order of the combinations exactly (one numpy pass); queue those that may beat the best."""
        rows = [sp.order_rows(c, self.orders) for sp, c in items]
        self.work += _cells(rows)
        ob = bound_parts(rows, self.L, self.refine_to())
        for (space, combo), vs in zip(items, ob.reshape(len(items), len(self.orders)).tolist()):
            for o, v in zip(self.orders, vs):
                self.push(Entry(v, Level.ORDER, space, combo, o))

    def chunks(self, items: list[tuple[DpSpace, Chunk]]) -> None:
        """Tight order-free bounds for the rows of some chunks below the best; the rest waits on the heap."""
        parts, owners = [], []
        for space, ch in items:
            lb, idx, start, size = ch.lb, ch.idx, ch.start, ch.size
            end = min(start + size, len(lb))
            cut = start + int(np.searchsorted(lb[start:end], self.top.cut(space.dp)))
            if cut > start:
                parts.append(space.free_rows(idx[start:cut]))
                owners += [(space, c) for c in idx[start:cut]]
            if cut < end:
                self.push(Entry(float(lb[cut]), Level.CHUNK, space, chunk=Chunk(lb, idx, cut, end - cut)))
            if end < len(lb):
                self.push(Entry(float(lb[end]), Level.CHUNK, space, chunk=Chunk(lb, idx, end, 2 * size)))
        if parts:
            self.work += _cells(parts)
            tight = bound_parts(parts, self.L, self.top.bound, FREE_REFINE)
            for v, (space, combo) in zip(tight.tolist(), owners):
                self.push(Entry(v, Level.COMBO, space, combo))

    def start(self, spaces: list[tuple[DpSpace, np.ndarray, np.ndarray]]) -> None:
        """Incumbents first (so that every bound after them is computed against the best): the best-bounded
        order of the combination with the least tight bound among each dp's cheapest few, and of each other
        dp's least-bounded one of at most START_STAGES stages. Then every dp's combinations enter the
        frontier as one chunk, in increasing cheap bound."""
        firsts = [(space, idx[np.argsort(lb, kind="stable")[:CHUNK]]) for space, lb, idx in spaces]
        tight = bound_parts([sp.free_rows(rows) for sp, rows in firsts], self.L, math.inf, 0).tolist()
        heads: list[tuple[float, DpSpace, np.ndarray]] = []  # per dp: its cheapest rows' least tight bound
        at = 0
        for sp, rows in firsts:
            k = at + min(range(len(rows)), key=lambda j: tight[at + j])
            heads.append((tight[k], sp, rows[k - at]))
            at += len(rows)
        heads.sort(key=lambda h: h[0])
        # the least bound can sit at a dp whose plans are far above it (Exp-A-1: dp 2 at 38.1 s, the optimum
        # 27.0 s at dp 8): the other dps' heads are split too where a short pipeline makes that cheap
        heads = heads[:1] + [h for h in heads[1:] if h[1].stages(h[2]) <= START_STAGES]
        # told a time to beat (a baseline's sub-cluster): a head bounded at or above it has no plan that beats
        # it, whatever the incumbent (Exp-A-1's A+B subset: 2 of its 3)
        self._split_best_orders([h for h in heads if h[0] < self.top.factors(h[1].dp, h[1].stages(h[2]))[1]])
        for space, lb, idx in spaces:
            o = np.argsort(lb, kind="stable")
            self.push(Entry(float(lb[o[0]]), Level.CHUNK, space, chunk=Chunk(lb[o], idx[o], 0, CHUNK)))

    def _split_best_orders(self, heads: list[tuple[float, DpSpace, np.ndarray]]) -> None:
        """Split each combination's order of least exact bound (one numpy pass for all)."""
        if not heads:
            return
        orders = self.orders
        ob = bound_parts([sp.order_rows(c, orders) for _, sp, c in heads], self.L, math.inf, 0)
        for (_, sp, c), vs in zip(heads, ob.reshape(len(heads), len(orders)).tolist()):
            self.split(sp, orders[min(range(len(orders)), key=vs.__getitem__)], c)

    def drain(self, collect: bool = False) -> None:
        """Best-first until no bound beats the best plan (within top.slack) or the work budget is spent;
        `collect`: only gathering plans within a margin of an optimum already found, so the budget stops it
        without bounding it."""
        top, frontier, limits = self.top, self.frontier, self.limits
        aside: list[Entry] = []  # above their own dp's cut, below another's: back on the heap at the end
        while frontier.least() < top.bound:
            over = self.work >= limits.work
            if top.items and (over or time.perf_counter() > self.deadline):
                if not collect:
                    what = (f"work budget {limits.work:,} units" if over else
                            f"time cap {limits.time_cap_s:g} s (wall clock: another machine or load may stop "
                            f"elsewhere)")
                    self.bounded.append(f"{what} (best-first search stopped with bounds from "
                                        f"{frontier.least():.4f} s open)")
                    self.open_bound = frontier.least()
                break
            e = frontier.pop()
            if e.bound >= top.cut(e.space.dp, _stages(e)):
                aside.append(e)
                continue
            if e.level is Level.ORDER:
                assert e.order is not None and e.combo is not None
                self.split(e.space, e.order, e.combo)
            elif e.level is Level.CHUNK:
                self.chunks([(x.space, _given(x.chunk)) for x in frontier.pop_more(e, top.bound, BATCH)])
            else:
                self.expand([(x.space, _given(x.combo)) for x in frontier.pop_more(e, top.bound, BATCH)])
        for e in aside:
            frontier.push(e)


def search_auto(cm: CostModel, group_size: int = 128, runners_up: int = 3, rerank: bool = True,
                progress: Progress | None = None, limits: Limits = DEFAULT_LIMITS, idle: str = "auto",
                margin: float = 0.0, beat_s: float = math.inf, unranked: bool = False) -> SearchResult:
    """The cost model's optimum. With `rerank`, it also keeps the plans within RERANK_SLACK of it (the model
    is an estimate of the schedule, the simulator executes it) and puts every plan it kept through the one
    ranking step (ranking.py: priced by simulation, the fastest first, each carrying its simulated time);
    `unranked` then returns them unranked, for a caller that adds more candidates to the pool
    (planning.run_search). Without `rerank`, the plans carry and are ranked by the search's objective
    (SearchResult.objective_s is its least either way).
    `idle`: "auto" searches plans that leave chips idle (idle.py) when no plan uses every chip or the
    search was bounded, "always" also when one does, "never" not at all. Their plans join the kept ones
    (the result's statistics are those of the better by the objective).

    `margin`: also keep the plans within this relative margin of the optimum (at most `runners_up`), for the
    ranking; collected within the work budget.

    Two phases: the first prunes against the best plan itself and finds the optimum; what falls within the
    margin is kept on the heap, and a second phase collects it only when the optimum is cheap enough to
    simulate (otherwise the margin would cost search time for plans the ranking never prices), or when the
    caller asks for a margin.

    `beat_s`: a simulated time the caller has already (baselines.py); plans that cannot run faster are not
    searched (their objective is at least beat_s times accuracy.objective_widen), and NothingFaster is raised
    when no plan can. Only for a schedule searched as itself (no parameters to choose afterwards)."""
    if idle not in IDLE_MODES:
        raise ValueError(f"search_auto: idle={idle!r}; expected one of {', '.join(IDLE_MODES)}")
    t0 = time.perf_counter()
    L = cm.model.layers
    names = [c.name for c in sorted(cm.cluster.chips, key=lambda c: -c.memory_gb)]
    orders, cut_orders = type_orders([cm.cluster.chip(n).memory_gb for n in names], limits.max_orders)
    bounded = [f"orders of chip types: {len(orders)} next to the memory-descending one"] if cut_orders else []
    dps = [dp for dp in dp_candidates(cm.cluster, cm.train) if _fewest_stages(cm, dp) <= L]
    wide = _rerank_slack(cm, dp_candidates(cm.cluster, cm.train)) if rerank else 0.0
    refined = max(RERANK_KEEP if rerank else 0, (3 if margin else runners_up) + 1)  # plans given inner_dp
    # pruning against the incumbent's full time where pricing it is affordable (FULL_PRICING_ACTIONS);
    # beyond, against the best objective, as a bounded search would
    priced = _priceable(cm, dps)
    share = _forward_share(cm)
    if math.isfinite(beat_s) and kind(cm.train.schedule).params:
        raise ValueError(f"search_auto: beat_s with {cm.train.schedule}, whose parameters the search does not see")

    def stretch(dp: int, p: int) -> float:
        return objective_widen(cm.train.schedule, share, p, micro_batches(cm.train, dp))

    top = _Top(max(refined, runners_up + 1), stretch, {dp: min(L, cm.cluster.total_chips // dp) for dp in dps},
               priced, beat_s)
    widen = top.widen
    spaces: list[tuple[DpSpace, np.ndarray, np.ndarray]] = []
    per_dp, grouped = {}, False
    for dp in dps:
        per_dp[dp], cut = type_choices(cm, dp, names, group_size, limits.max_groups)
        grouped |= cut
    if grouped:
        bounded.append(f"groups: at most {limits.max_groups} per chip type")
    if sum(math.prod(len(c) for c in ch) for ch in per_dp.values()) > limits.max_rows:
        for ch in per_dp.values():
            trim_choices(ch, limits.max_rows // len(per_dp))
        bounded.append(f"TP choices: the first of each type's, at most {limits.max_rows} combinations over all dps")
    every = [DpSpace(cm, dp, micro_batches(cm.train, dp), names, group_size, ch) for dp, ch in per_dp.items()]
    every = [space for space in every if all(space.choices)]
    if progress and bounded:
        progress("search space bounded: " + "; ".join(bounded))
    fits = False
    for space, (lb, idx) in zip(every, cheap_bounds(every)):
        keep = np.isfinite(lb)
        fits |= bool(keep.any())
        if math.isfinite(beat_s) and keep.any():  # what cannot beat the caller's time at its own stage count
            counts = space.stage_counts(idx)
            beyond = {p: top.factors(space.dp, p)[1] for p in np.unique(counts).tolist()}
            keep &= lb < np.array([beyond[p] for p in counts.tolist()])
        if keep.any():
            spaces.append((space, lb[keep], idx[keep]))
    if fits and not spaces:
        raise NothingFaster(f"no plan runs faster than {beat_s:.6g} s")
    if not spaces:
        return _idle_only(cm, group_size, runners_up, rerank and not unranked, progress, limits, idle)
    deadline = t0 + limits.time_cap_s if limits.time_cap_s is not None else math.inf
    bf = BestFirst(cm, names, orders, top, widen, priced, max(wide, margin), limits, deadline, bounded, progress)
    bf.start(spaces)
    bf.drain()
    if not top.items and math.isfinite(beat_s):
        raise NothingFaster(f"no plan runs faster than {beat_s:.6g} s")
    if not top.items:  # every split failed (a memory cap the cheap bounds do not see): as when none fits
        return _idle_only(cm, group_size, runners_up, rerank and not unranked, progress, limits, idle)
    near_slack = wide if _affordable(cm, top.items[0]) and not bounded else 0.0  # the simulator re-ranks these
    if max(near_slack, margin) and not bounded:
        top.slack = max(near_slack, margin)
        bf.drain(collect=True)
    bf.pruned += len(bf.frontier)
    items = top.kept()
    # per-stage data parallelism on the kept plans (the plans a margin adds stay as found); a plan it
    # improves may overtake the ones before it
    split_rows = [with_inner_dp(cm, c) for c in items[:refined]] + items[refined:]
    if any(a is not c for a, c in zip(split_rows, items)):
        items = sorted(split_rows, key=lambda c: c.time_s)
    objective = min(c.time_s for c in items)
    pool = items if rerank else items[:runners_up + 1]
    low = relaxed_bound(cm, dps) if bounded else None
    if bounded and len(bounded) == 1 and bf.open_bound is not None and low is not None:
        # only the budget stopped it: the heap bounds the rest
        low = max(low, min(bf.open_bound, top.items[0].time_s) / max(widen.values()))
    res = SearchResult(pool[0], pool[1:], bf.evaluated, bf.pruned, time.perf_counter() - t0, bounded, low,
                       objective, bf.work)
    if idle == "always" or (idle == "auto" and bounded):  # a bounded search may miss what idle chips gain
        cap = None if limits.time_cap_s is None else max(limits.time_cap_s - (time.perf_counter() - t0), 0.0)
        try:
            other: SearchResult | None = search_idle(
                cm, replace(limits, work=max(limits.work - bf.work, 0), time_cap_s=cap), progress, runners_up)
        except InfeasibleError:
            other = None
        if other is not None:
            # both go to the ranking (ranking.py); the result's statistics are the objective's winner's
            idle_plans = [other.best, *other.runners_up]
            if other.best.time_s < objective:
                low_idle = relaxed_bound(cm, dps)
                res = replace(other, runners_up=[*other.runners_up, *pool], bounded=bounded + other.bounded,
                              lower_bound_s=low_idle if other.lower_bound_s is None
                              else min(other.lower_bound_s, low_idle),
                              objective_s=other.best.time_s, work=other.work + bf.work)
            else:
                res = replace(res, runners_up=[*res.runners_up, *idle_plans])
    res.search_time_s = time.perf_counter() - t0
    if progress and res.bounded and res.lower_bound_s is not None:
        progress(f"bounded search: best {res.best.time_s:.4f} s, no plan below {res.lower_bound_s:.4f} s")
    return ranked(cm, res, group_size, runners_up) if rerank and not unranked else res


def _idle_only(cm: CostModel, group_size: int, runners_up: int, rank: bool, progress: Progress | None,
               limits: Limits, idle: str) -> SearchResult:
    """No plan uses every chip: the plans that leave chips idle (idle.py) unless `idle` is "never" (64 + 25
    chips whose every full split overflows a stage's memory plan as 64 + 24 do)."""
    if idle == "never":
        raise InfeasibleError(explain_infeasible(cm))
    try:
        res = search_idle(cm, limits, progress, runners_up)
    except InfeasibleError:
        raise InfeasibleError(explain_infeasible(cm, idle=True) + " (leaving chips idle did not help)") from None
    res = replace(res, objective_s=res.best.time_s)
    return ranked(cm, res, group_size, runners_up) if rank else res


def ranked(cm: CostModel, res: SearchResult, group_size: int = 128, runners_up: int = 3) -> SearchResult:
    """The search's plans through the one ranking step (ranking.py), with h2's layer sharding of its best
    plan's dp and TP sizes (the paper's heuristic can win a near-tie the objective misjudges): fastest by
    simulation first, each carrying its simulated time; at most `runners_up` after the best. Priced only:
    the local search runs where planning.run_search ranks (on instances small enough to simulate)."""
    rk = Ranking(Problem(cm.cluster, cm.model, cm.train, cm))
    rk.offer([res.best, *h2_candidates(cm, res.best.dp, _runs(res.best.stages), group_size), *res.runners_up])
    got = rk.ranked()
    if not got:
        return res
    res = replace(res, best=got[0], runners_up=got[1:runners_up + 1],
                  objective_s=res.objective_s if res.objective_s is not None else res.best.time_s)
    return rk.noted(res)


T = TypeVar("T")


def _given(x: T | None) -> T:
    """A frontier entry's field its level always sets."""
    assert x is not None
    return x


def _stages(e: Entry) -> int | None:
    """The stage count of an entry's plans: its combination's (COMBO, ORDER); None for a CHUNK's rows."""
    return None if e.combo is None else e.space.stages(e.combo)


def _cells(parts: list[Any]) -> int:
    """Work units of bounding these stage matrices (rows x stage slots)."""
    return -(-sum(int(p.a0.size) for p in parts) // BOUND_CELLS_PER_UNIT)


def _priceable(cm: CostModel, dps: list[int]) -> bool:
    """Whether the search prices each plan it splits in full (round trips: tens of ms for 30 stages) and
    prunes by the incumbent's full time: on clusters of at most FULL_PRICING_CHIPS chips whose longest plan
    of any dp stays within FULL_PRICING_ACTIONS stage x micro-batch pairs. Beyond, it prunes by the best
    objective, as before (1,024 chips of 8 types: 1.1 s -> 3.2 s and a time-bounded search when priced)."""
    return cm.cluster.total_chips <= FULL_PRICING_CHIPS and longest_plan_actions(cm, dps) <= FULL_PRICING_ACTIONS


def longest_plan_actions(cm: CostModel, dps: list[int]) -> int:
    """Stage x micro-batch pairs of the longest plan at any of `dps` (as many stages as layers or chips
    allow): what simulating or fully pricing one plan costs at most."""
    total = cm.train.micro_batches_total
    return max((min(cm.model.layers, cm.cluster.total_chips // dp) * (total // dp) for dp in dps), default=0)


def _forward_share(cm: CostModel) -> float:
    """The largest forward share of a layer's compute, fwd / (fwd + bwd), over the cluster's chips and TP
    sizes (accuracy.objective_widen)."""
    shares = [t.fwd_s / (t.fwd_s + t.bwd_s) for c in cm.cluster.chips if c.name in cm.profile.chips
              for t in cm.profile.chips[c.name].tp.values() if t.fwd_s + t.bwd_s > 0]
    return max(shares, default=1.0)


def _fewest_stages(cm: CostModel, dp: int) -> float:
    """The fewest pipeline stages at dp when every chip serves (each type at its largest TP size that
    splits its per-replica chips); a dp with more stages than layers has no plan."""
    counts, total = tp_counts(cm.model), 0
    for c in cm.cluster.chips:
        per = c.count // dp
        fits = [t for t in tp_sizes(c, *counts) if per % t == 0]
        if c.count % dp or not fits:
            return math.inf
        total += per // max(fits)
    return total


def _cost(cm: CostModel, c: Candidate) -> int:
    return len(c.stages) * micro_batches(cm.train, c.dp)


def _affordable(cm: CostModel, best: Candidate) -> bool:
    """The re-rank runs when half the kept plans, each as long as the optimum, fit the simulation budget."""
    return RERANK_KEEP // 2 * _cost(cm, best) <= RERANK_MAX_ACTIONS


def _rerank_slack(cm: CostModel, dps: list[int]) -> float:
    """The wide margin only where simulating every kept plan surely stays within the re-rank budget."""
    return RERANK_SLACK_SMALL if longest_plan_actions(cm, dps) * RERANK_KEEP <= RERANK_MAX_ACTIONS else RERANK_SLACK


def _runs(stages: list[StageSpec]) -> list[tuple[str, int, int]]:
    return [(c, t, len(list(g))) for (c, t), g in itertools.groupby((s.chip, s.tp) for s in stages)]
