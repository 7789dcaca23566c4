"""`--algo auto`: exact best-first search over data parallelism, the order of chip types along the pipeline,
per-group TP sizes, per-stage layer counts and recompute, under the full cost model (costs.py).

Three levels of bounds, each below the next, feed one heap (dpspace.py builds them, levels.py computes
the tight ones for many rows at once with numpy):
1. every combination of per-type TP choices at every dp gets a cheap order-free bound; they enter the heap
   in chunks, in increasing cheap bound;
2. a popped chunk gives its combinations the tight order-free bound (integral caps with recompute, the
   least fill and update level at each bottleneck level);
3. a popped combination gives each order of chip types the same bound on its exact stage sequence (end
   stages, in-flight counts, links, drain gaps), and a popped order gets the exact layer split (split.py).
An incumbent is found first (the best-bounded order of the most promising combination) so that every
tight bound is computed against it. The search stops when no bound beats the best plan: the result is the
optimum of the cost model.
"""
from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

import numpy as np

from ..spec import InfeasibleError
from .costs import CostModel, StageSpec, in_flight, micro_batches
from .dpspace import DpSpace
from .levels import lower_bound
from .space import dp_candidates
from .split import StageOpt, best_split

Progress = Callable[[str], None]


@dataclass
class Candidate:
    time_s: float
    dp: int
    stages: list[StageSpec]
    label: str = ""


@dataclass
class SearchResult:
    best: Candidate
    runners_up: list[Candidate] = field(default_factory=list)
    evaluated: int = 0
    pruned: int = 0
    search_time_s: float = 0.0


class _Top:
    """Best plan plus runners-up within a relative `slack` of it (the simulator re-ranks those)."""

    def __init__(self, keep: int, slack: float = 0.0) -> None:
        self.keep, self.slack, self.items = keep, slack, []

    @property
    def bound(self) -> float:
        return self.items[0].time_s * (1 + self.slack) if self.items else math.inf

    def add(self, c: Candidate) -> None:
        self.items.append(c)
        self.items.sort(key=lambda x: x.time_s)
        del self.items[self.keep:]


@lru_cache(maxsize=None)
def _opt(cm: CostModel, chip: str, tp: int, dp: int, b: int, n: int, first: bool, last: bool) -> StageOpt:
    cs = [cm.coef(chip, tp, r, dp) for r in (False, True)]
    a0 = b0 = y0 = 0.0
    for flag, which in ((first, "first"), (last, "last")):
        if flag:
            e = cm.end(chip, tp, dp, which)
            a0 += b * e.time - e.beta
            b0 += e.beta
            y0 += e.upd
    m = tuple(cm.max_layers(chip, tp, r, dp, n, first, last) for r in (False, True))
    return StageOpt(a0, tuple(b * c.tau - c.beta for c in cs), b0, tuple(c.beta for c in cs), m, y0, cs[0].upd)


def stage_opts(cm: CostModel, seq: list[tuple[str, int]], dp: int, b: int) -> tuple[list[StageOpt], float, float]:
    """StageOpts for a (chip, tp) sequence (update offsets by the drain gaps), the link term Lambda and the
    constant 2 * sum(e)."""
    p, sched = len(seq), cm.train.schedule
    gaps = cm.drain_gaps(seq, dp)
    opts = []
    for k, (chip, tp) in enumerate(seq):
        o = _opt(cm, chip, tp, dp, b, in_flight(sched, k, p, b), k == 0, k == p - 1)
        opts.append(StageOpt(o.a0, o.a, o.b0, o.bt, o.m, o.y0 - gaps[k], o.ups))
    es = [cm.boundary(seq[k][0], seq[k][1], seq[k + 1][0], seq[k + 1][1], dp) for k in range(p - 1)]
    lam = max((b * e - 2 * e for e in es), default=-math.inf)
    return opts, lam, 2 * sum(es)


CHUNK = 16  # combinations per first tight-bound batch of a dp (then doubling)
FREE_REFINE = 3
RERANK_SLACK = 0.01  # plans within 1% of the model's optimum are near-ties the model cannot separate
RERANK_SLACK_SMALL = 0.10  # short pipelines with few micro-batches: the model is up to ~9% pessimistic
RERANK_KEEP = 8
RERANK_MAX_ACTIONS = 4_000  # stage x micro-batch pairs: the model is loose only for short, few-micro-batch pipelines


def search_auto(cm: CostModel, group_size: int = 128, runners_up: int = 3, rerank: bool = True,
                progress: Progress | None = None) -> SearchResult:
    """The cost model's optimum; with `rerank`, the simulator then picks among the plans within
    RERANK_SLACK of it (the model is an estimate of the schedule, the simulator executes it)."""
    t0 = time.perf_counter()
    L = cm.model.layers
    names = [c.name for c in sorted(cm.cluster.chips, key=lambda c: -c.memory_gb)]
    orders = list(itertools.permutations(range(len(names))))
    slack = _rerank_slack(cm) if rerank else 0.0
    top = _Top(max(runners_up + 1, RERANK_KEEP if rerank else 0), slack)
    stats = {"evaluated": 0, "pruned": 0}
    spaces: list[tuple[DpSpace, np.ndarray, np.ndarray]] = []
    for dp in dp_candidates(cm.cluster, cm.train):
        space = DpSpace(cm, dp, micro_batches(cm.train, dp), names, group_size)
        if all(space.choices):
            lb, idx = space.combos()
            keep = np.isfinite(lb)
            if keep.any():
                spaces.append((space, lb[keep], idx[keep]))
    if not spaces:
        raise InfeasibleError(explain_infeasible(cm))
    tick = itertools.count()

    def split(space: DpSpace, order: tuple[int, ...], combo: np.ndarray) -> None:
        runs = [(names[i], t, s) for i in order for t, s in space.choices[i][combo[i]]]
        seq = [(c, t) for c, t, s in runs for _ in range(s)]
        opts, lam, const = stage_opts(cm, seq, space.dp, space.b)
        stats["evaluated"] += 1
        res = best_split(opts, L, lam, const, top.bound)
        if res is not None:
            stages = [StageSpec(ch, t, l, r) for (ch, t), l, r in zip(seq, res.layers, res.recompute)]
            label = f"dp={space.dp} " + " ".join(f"{c}:tp{t}x{s}" for c, t, s in runs)
            top.add(Candidate(res.total, space.dp, stages, label))
        if progress and stats["evaluated"] % 200 == 0:
            progress(f"{stats['evaluated']} configurations split, best {top.bound:.3f} s")

    def expand(space: DpSpace, combo: np.ndarray, heap: list) -> None:
        """Bound every order of the combination exactly; queue those that may beat the best."""
        ob = lower_bound(space.order_rows(combo, orders), L, top.bound)
        for o, v in zip(orders, ob.tolist()):
            if v < top.bound:
                heapq.heappush(heap, (v, next(tick), space, o, combo))
            else:
                stats["pruned"] += 1

    # An incumbent first (so that every bound below is computed against it): the best-bounded order of the
    # combination with the least tight bound among each dp's cheapest few.
    firsts = []
    for space, lb, idx in spaces:
        rows = idx[np.argsort(lb, kind="stable")[:CHUNK]]
        tight = lower_bound(space.free_rows(rows), L, math.inf, 0)
        firsts.append((float(tight.min()), space, rows[int(np.argmin(tight))]))
    _, space0, combo0 = min(firsts, key=lambda x: x[0])
    ob = lower_bound(space0.order_rows(combo0, orders), L, math.inf, 0)
    split(space0, orders[int(np.argmin(ob))], combo0)
    # Best-first over three levels, each bound below the next: chunks of combinations in increasing cheap
    # bound (the chunk's first), combinations with their tight order-free bound, orders with their exact bound.
    heap: list = []
    for space, lb, idx in spaces:
        o = np.argsort(lb, kind="stable")
        heap.append((float(lb[o[0]]), next(tick), space, "chunk", (lb[o], idx[o], 0, CHUNK)))
    heapq.heapify(heap)
    while heap and heap[0][0] < top.bound:
        _, _, space, what, data = heapq.heappop(heap)
        if what == "chunk":
            lb, idx, start, size = data
            end = start + size
            rows = idx[start:end][lb[start:end] < top.bound]
            if len(rows):
                tight = lower_bound(space.free_rows(rows), L, top.bound, FREE_REFINE)
                for v, combo in zip(tight.tolist(), rows):
                    if v < top.bound:
                        heapq.heappush(heap, (v, next(tick), space, "combo", combo))
            if end < len(lb):
                heapq.heappush(heap, (float(lb[end]), next(tick), space, "chunk", (lb, idx, end, 2 * size)))
        elif what == "combo":
            expand(space, data, heap)
        else:
            split(space, what, data)
    stats["pruned"] += len(heap)
    if not top.items:
        raise InfeasibleError(explain_infeasible(cm))
    items = top.items
    if rerank:
        near = [c for c in items if c.time_s <= items[0].time_s * (1 + slack)]
        items = _rerank(cm, near) + [c for c in items if c not in near]
    return SearchResult(items[0], items[1:runners_up + 1], stats["evaluated"], stats["pruned"], time.perf_counter() - t0)


def _rerank_slack(cm: CostModel) -> float:
    """The wide margin only where simulating every kept plan surely stays within the re-rank budget."""
    total = cm.train.micro_batches_total
    worst = max(min(cm.model.layers, cm.cluster.total_chips // dp) * (total // dp)
                for dp in dp_candidates(cm.cluster, cm.train))
    return RERANK_SLACK_SMALL if worst * RERANK_KEEP <= RERANK_MAX_ACTIONS else RERANK_SLACK


def _rerank(cm: CostModel, cands: list[Candidate]) -> list[Candidate]:
    from .plan_sim import simulate_stages
    cost = sum(len(c.stages) * micro_batches(cm.train, c.dp) for c in cands)
    if len(cands) < 2 or cost > RERANK_MAX_ACTIONS:
        return cands
    sims = [simulate_stages(cm, c.stages, c.dp).iteration_time_s for c in cands]
    for c, t in zip(cands, sims):
        c.label += f" simulated {t:.4f} s"
    return [c for _, c in sorted(zip(sims, cands), key=lambda x: x[0])]


def explain_infeasible(cm: CostModel) -> str:
    """Why nothing fits: the best any stage can do on each chip type."""
    L, parts = cm.model.layers, []
    for c in cm.cluster.chips:
        best = max(cm.max_layers(c.name, c.tp_max, True, 1, 1, False, False), 0)
        parts.append(f"{c.name}: at most {best} layer(s) per stage even at tp={c.tp_max} with recompute "
                     f"and one micro-batch in flight ({c.memory_gb:g} GB x {c.memory_fraction:g} usable)")
    stages = sum(c.count // c.tp_max for c in cm.cluster.chips)
    return (f"no plan fits the {L}-layer model {cm.model.name!r} on cluster {cm.cluster.name!r}: "
            + "; ".join(parts) + f"; at most {stages} stages are possible")
