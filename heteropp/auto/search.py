"""`--algo auto`: exact best-first search over data parallelism, the order of chip types along the pipeline,
per-group TP sizes, per-stage layer counts and recompute, under the full cost model (costs.py).

1. For every dp and every combination of per-type TP choices (the whole type, or its 128-chip groups with
   non-increasing TP) a lower bound that ignores the order of types is computed for all combinations at
   once (bounds.py, vectorised), and the combinations are visited in increasing bound.
2. A visited combination expands into one entry per order of chip types, each with a tighter bound that
   uses the exact in-flight counts, link costs and update floor of that order.
3. An order whose bound is below the best plan so far gets the exact layer split (split.py).
The search stops when the smallest remaining bound cannot beat the best plan, so the result is the optimum
of the cost model. Per-kind tables and per-stage coefficients are computed once and memoised.
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
from .bounds import Kind, fill_floor, integral_level, make_kind, update_level, water_level, water_level_many
from .costs import CostModel, StageSpec, in_flight, micro_batches
from .space import dp_candidates, heads_gcd, stage_tp_choices
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


class _DpSpace:
    """Everything for one dp: per-type TP choices as runs of (tp, stages), per-kind tables, and the
    order-free bound of every combination of choices."""

    def __init__(self, cm: CostModel, dp: int, b: int, names: list[str], group_size: int) -> None:
        self.cm, self.dp, self.b, self.names = cm, dp, b, names
        L = cm.model.layers
        self.choices: list[list[list[tuple[int, int]]]] = []
        for name in names:
            runs = []
            for ts in stage_tp_choices(cm.cluster.chip(name), dp, group_size, heads_gcd(cm)):
                if len(ts) <= L:
                    runs.append([(t, len(list(g))) for t, g in itertools.groupby(ts)])
            self.choices.append(runs)
        self.kinds: dict[tuple[str, int], Kind] = {}

    def kind(self, chip: str, tp: int) -> Kind:
        k = self.kinds.get((chip, tp))
        if k is None:
            k = self.kinds[(chip, tp)] = make_kind(self.cm, chip, tp, self.dp, self.b, max(self.cm.model.layers, self.b))
        return k

    def _upto(self, kd: Kind, x: int) -> float:
        """m(n_1) + ... over the in-flight counts min(v, b) for v = 1..x (1F1B)."""
        return float(kd.cum[min(x, self.b)]) + max(x - self.b, 0) * float(kd.mmax[self.b])

    def _cap_free(self, chip: str, tp: int, s: int, p_min: int) -> float:
        """Capacity of s stages of one kind wherever they sit: their in-flight counts are distinct under
        1F1B (at best 1..s), b under GPipe and min(p, b) >= min(s, b) under ZB-H1."""
        kd, sched = self.kind(chip, tp), self.cm.train.schedule
        if sched == "1f1b":
            return self._upto(kd, s)
        return s * float(kd.mmax[self.b if sched == "gpipe" else min(p_min, self.b)])

    def combos(self) -> tuple[np.ndarray, list[tuple[int, ...]]]:
        """Order-free lower bounds of every combination (index tuples into self.choices)."""
        L = self.cm.model.layers
        per_type = []
        for name, runs_list in zip(self.names, self.choices):
            rows = []
            for runs in runs_list:
                s_tot = sum(s for _, s in runs)
                rate = sum(s / self.kind(name, t).a for t, s in runs)
                cap = sum(self._cap_free(name, t, s, s_tot) for t, s in runs)
                beta = min(self.kind(name, t).beta for t, _ in runs)
                fill1 = sum(s * self.kind(name, t).beta for t, s in runs)
                one = max(self.kind(name, t).one_layer(1) for t, _ in runs)  # n = 1 is the most lenient
                rows.append((rate, cap, beta, s_tot, fill1, one))
            per_type.append(np.array(rows, dtype=np.float64).reshape(-1, 6))
        idx = np.array(list(itertools.product(*(range(len(r)) for r in per_type))), dtype=np.int64)
        if idx.size == 0:
            return np.zeros(0), []
        cols = [per_type[i][idx[:, i]] for i in range(len(per_type))]
        rates = np.stack([c[:, 0] for c in cols], axis=1)
        caps = np.stack([c[:, 1] for c in cols], axis=1)
        beta = np.min(np.stack([c[:, 2] for c in cols], axis=1), axis=1)
        stages = np.sum(np.stack([c[:, 3] for c in cols], axis=1), axis=1)
        fill1 = np.sum(np.stack([c[:, 4] for c in cols], axis=1), axis=1)
        one = np.max(np.stack([c[:, 5] for c in cols], axis=1), axis=1)
        with np.errstate(invalid="ignore"):
            lb = np.maximum(water_level_many(rates, caps, L), one) + fill1 + beta * (L - stages)
        lb[stages > L] = np.inf
        return lb, [tuple(int(v) for v in row) for row in idx]

    def order_bound(self, seq_runs: list[tuple[str, int, int]]) -> float:
        """Bound with the order fixed: exact in-flight counts, link terms and the first stage's update."""
        cm, b, L = self.cm, self.b, self.cm.model.layers
        p = sum(s for _, _, s in seq_runs)
        rates, caps, betas, counts, kinds = [], [], [], [], []
        one = 0.0
        k0 = 0
        for chip, tp, s in seq_runs:
            kd = self.kind(chip, tp)
            if cm.train.schedule == "1f1b":
                cap = self._upto(kd, p - k0) - self._upto(kd, p - k0 - s)
            else:
                cap = s * float(kd.mmax[self.b if cm.train.schedule == "gpipe" else min(p, self.b)])
            rates.append(s / kd.a), caps.append(cap), betas.append(kd.beta), counts.append(s)
            kinds.append((kd.a, s, cap))
            # the stage of this run with the most in flight is its first
            one = max(one, kd.one_layer(in_flight(cm.train.schedule, k0, p, b)))
            k0 += s
        z = max(integral_level(water_level(rates, caps, L), kinds, L), one)
        if not math.isfinite(z):
            return math.inf
        chips = [(c, t) for c, t, s in seq_runs for _ in range(s)]
        es = [cm.boundary(*chips[k], *chips[k + 1], self.dp) for k in range(p - 1)]
        lam = max((b * e - 2 * e for e in es), default=-math.inf)
        ups = [self.kind(c, t).upd for c, t in chips]
        w = update_level(ups, cm.drain_gaps(chips, self.dp), L)
        return max(z, lam) + fill_floor(betas, counts, L) + 2 * sum(es) + w


RERANK_SLACK = 0.01  # plans within 1% of the model's optimum are near-ties the model cannot separate
RERANK_KEEP = 8
RERANK_MAX_ACTIONS = 200_000  # simulate only while the re-ranking stays cheap


def search_auto(cm: CostModel, group_size: int = 128, runners_up: int = 3, rerank: bool = True,
                progress: Progress | None = None) -> SearchResult:
    """The cost model's optimum; with `rerank`, the simulator then picks among the plans within
    RERANK_SLACK of it (the model is an estimate of the schedule, the simulator executes it)."""
    t0 = time.perf_counter()
    L = cm.model.layers
    names = [c.name for c in sorted(cm.cluster.chips, key=lambda c: -c.memory_gb)]
    orders = list(itertools.permutations(range(len(names))))
    top = _Top(max(runners_up + 1, RERANK_KEEP if rerank else 0), RERANK_SLACK if rerank else 0.0)
    stats = {"evaluated": 0, "pruned": 0}
    heap: list[tuple[float, int, tuple]] = []  # (bound, tiebreak, entry)
    tick = itertools.count()
    for dp in dp_candidates(cm.cluster, cm.train):
        space = _DpSpace(cm, dp, micro_batches(cm.train, dp), names, group_size)
        if not all(space.choices):
            continue
        lb, idx = space.combos()
        for v, combo in zip(lb.tolist(), idx):
            if math.isfinite(v):
                heap.append((v, next(tick), ("combo", space, combo)))
    if not heap:
        raise InfeasibleError(explain_infeasible(cm))
    heapq.heapify(heap)
    while heap and heap[0][0] < top.bound:
        _, _, entry = heapq.heappop(heap)
        if entry[0] == "combo":
            _, space, combo = entry
            for order in orders:
                runs = [(names[i], t, s) for i in order for t, s in space.choices[i][combo[i]]]
                ob = space.order_bound(runs)
                if ob < top.bound:
                    heapq.heappush(heap, (ob, next(tick), ("order", space, runs)))
                else:
                    stats["pruned"] += 1
            continue
        _, space, runs = entry
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
    stats["pruned"] += len(heap)
    if not top.items:
        raise InfeasibleError(explain_infeasible(cm))
    items = top.items
    if rerank:
        items = _rerank(cm, [c for c in items if c.time_s <= items[0].time_s * (1 + RERANK_SLACK)]) + \
            [c for c in items if c.time_s > items[0].time_s * (1 + RERANK_SLACK)]
    return SearchResult(items[0], items[1:runners_up + 1], stats["evaluated"], stats["pruned"], time.perf_counter() - t0)


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
