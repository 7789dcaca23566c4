"""The one ranking step after the search (issue 30 item 8): every candidate plan, whatever found it (the
best-first search's kept plans, h2's sharding of its best, the larger space of small instances, the
idle-chip candidates, the baselines, every micro-batch size), goes into one pool, ranked by one cheap
objective, and the simulator prices the pool in that order within one budget; the fastest wins.

* **The cheap objective** (`floor`) is a lower bound of a plan's simulated time with its best schedule
  parameters: the most of `plan_sim.compute_floor` (a stage's compute after the first micro-batch reaches
  it; under interleaved 1F1B, whose virtual stages start earlier, its compute alone) and, for a schedule
  without parameters, the search's objective over `accuracy.objective_widen` (the objective overprices a
  plan's simulated time by at most that factor). Both cost a pass over the stages, not a simulation.
* **Pricing**: in increasing floor, each plan is simulated with every option of its schedule's parameters
  (`pricing.best_params`) until the next floor reaches the fastest time found: no plan left unpriced can
  run faster, so the pool's fastest plan is found exactly.
* **The budget** (`RANK_ACTIONS`): simulated actions (one stage running one micro-batch under one option
  of the schedule's parameters). Pricing charges it first; what is left goes to a local
  search from the fastest plans (`pricing.refine`: single layer moves and warm-up steps). Where it
  stops the pricing while a plan it left unpriced has a floor below the returned time, the result says so
  (`bounded`) with the least such floor, which then bounds the result (`lower_bound_s`). A subset of the
  chip types planned as a baseline gets `1 / SUB_SHARE` of it, as it gets that share of the work budget.

The count of actions, never seconds, so the same inputs rank the same way on any machine under any load.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable

from ..schedules import kind
from ..spec import InfeasibleError
from .accuracy import objective_widen
from .candidates import Candidate, SearchResult
from .costs import micro_batches
from .plan_sim import compute_floor, stage_times
from .pricing import WARMUP_OR_CHUNK_OPTIONS, best_params, refine
from .problem import Problem

# the one budget: simulated actions for pricing the pool and the local search (HARP Setting 1 under H-1F1B
# prices its 24-plan pool with ~97,000; the paper experiments with under 25,000)
RANK_ACTIONS = 200_000
SUB_SHARE = 8  # a subset of the chip types planned as a baseline ranks with 1 / this of the budget
TIE = 1e-9  # relative: a plan must be faster than the fastest by more than this to replace it

# a plan's micro-batch size (where searched), dp and stages
Sig = tuple[int | None, int, tuple[tuple[str, int, int, bool, int], ...]]


def sig(c: Candidate) -> Sig:
    return c.micro_batch_size, c.dp, tuple((s.chip, s.tp, s.layers, s.recompute, s.inner_dp) for s in c.stages)


def forward_share(pb: Problem) -> float:
    """The largest forward share of a layer's compute, fwd / (fwd + bwd), over the cluster's chips and TP
    sizes (accuracy.objective_widen)."""
    cm = pb.cm
    shares = [t.fwd_s / (t.fwd_s + t.bwd_s) for c in cm.cluster.chips if c.name in cm.profile.chips
              for t in cm.profile.chips[c.name].tp.values() if t.fwd_s + t.bwd_s > 0]
    return max(shares, default=1.0)


def floor(pb: Problem, c: Candidate, share: float, objective: float | None = None) -> float:
    """A lower bound of `c`'s simulated time under the problem's schedule with its best parameters (the
    module's docstring); inf where the plan does not fit in memory. `objective`: the search's objective of
    `c`, known to fit, where the caller has it."""
    cm, b, sched = pb.cm, micro_batches(pb.train, c.dp), pb.train.schedule
    if objective is None:
        est = cm.evaluate(c.stages, c.dp, b)  # the search's objective, under the schedule it searches as
        if not est.feasible:
            return math.inf
        objective = est.iteration_time_s
    if "chunks" in kind(sched).params:  # virtual stages start before the physical one ahead finishes
        st, _ = stage_times(cm, c.stages, c.dp)
        return max(b * (t.fwd + t.bwd) + t.update for t in st)
    low = compute_floor(cm, c.stages, c.dp)
    if not kind(sched).params:  # the objective's bound holds for the schedule it was computed under
        low = max(low, objective / objective_widen(sched, share, len(c.stages), b))
    return low


def cost(pb: Problem, c: Candidate) -> int:
    """Simulated actions of pricing `c`: its stages x micro-batches, times its schedule's options."""
    options = WARMUP_OR_CHUNK_OPTIONS if kind(pb.train.schedule).params else 1
    return len(c.stages) * micro_batches(pb.train, c.dp) * options


@dataclass
class Ranking:
    """The pool as it is priced. `offer` adds candidates (the pool may grow: the baselines' sub-clusters
    are told the fastest time so far, `best_s`, and skip what cannot beat it); `polish` spends what is
    left of the budget on the local search; `ranked` gives the plans fastest first, each carrying its
    simulated time and parameters. Where the micro-batch size is searched, each size's plans are offered
    with that size's problem (`offer(pb=)`); they carry the size and are priced under it (the global batch
    is the same at every size, so the times compare)."""
    pb: Problem
    budget: int = RANK_ACTIONS
    spent: int = 0
    priced: list[tuple[float, int, Candidate]] = field(default_factory=list)  # (simulated s, pool order, plan)
    seen: set[Sig] = field(default_factory=set)
    offered: int = 0
    skipped: int = 0  # floors at or above the fastest: cannot win
    unpriced: int = 0  # floors below it that the budget left unpriced
    open_floor: float = math.inf  # the least of those floors
    shares: dict[int | None, float] = field(default_factory=dict)
    problems: dict[int | None, Problem] = field(default_factory=dict)  # by micro-batch size, where searched

    @property
    def best_s(self) -> float:
        return min((t for t, _, _ in self.priced), default=math.inf)

    def problem(self, c: Candidate) -> Problem:
        """The problem `c` is priced under: its micro-batch size's where it carries one."""
        return self.pb if c.micro_batch_size is None else self.problems[c.micro_batch_size]

    def offer(self, cands: Iterable[Candidate], pb: Problem | None = None) -> None:
        """Price the new candidates in increasing floor while a floor is below the fastest time. `pb`: the
        problem of another micro-batch size, whose plans they are."""
        size = None
        if pb is not None and pb is not self.pb:
            size = pb.train.micro_batch_size
            self.problems[size] = pb
        pb = pb or self.pb
        if size not in self.shares:
            self.shares[size] = forward_share(pb)
        pool: list[tuple[float, int, Candidate]] = []
        for c in cands:
            if size is not None:
                c = replace(c, micro_batch_size=size)
            s = sig(c)
            if s in self.seen:
                continue
            self.seen.add(s)
            self.offered += 1
            low = floor(pb, c, self.shares[size])
            if math.isfinite(low):
                pool.append((low, self.offered, c))
        pool.sort(key=lambda x: x[:2])
        for n, (low, i, c) in enumerate(pool):
            if low >= self.best_s * (1 - TIE):
                self.skipped += len(pool) - n  # sorted: none after it can win either
                break
            need = cost(pb, c)
            if self.priced and self.spent + need > self.budget:
                self.unpriced += 1
                self.open_floor = min(self.open_floor, low)
                continue
            self.spent += need
            self.price(c, i)

    def price(self, c: Candidate, i: int) -> None:
        try:
            q, _, t = best_params(self.problem(c), c)
        except InfeasibleError:
            return
        self.priced.append((t, i, replace(c, time_s=t, params=q or None)))

    def polish(self) -> None:
        """The local search (pricing.refine) from each priced plan, fastest first, while the budget lasts:
        the search's layer split is the best under its objective, not under the simulator or the
        schedule's parameters."""
        for t, i, c in sorted(self.priced, key=lambda x: x[:2]):
            left = self.budget - self.spent
            if left <= 0:
                break
            t2, better, rest = refine(self.problem(c), c, left, self.move_floor(c))
            self.spent += left - rest
            if t2 < t:
                self.priced.append((t2, i, replace(better, time_s=t2)))

    def move_floor(self, c: Candidate) -> Callable[[Candidate], float]:
        """The floor of a layer move from `c` (pricing.refine), which carries its objective."""
        pb, share = self.problem(c), self.shares[c.micro_batch_size]
        return lambda nb: floor(pb, nb, share, nb.time_s)

    def ranked(self) -> list[Candidate]:
        return [c for _, _, c in sorted(self.priced, key=lambda x: x[:2])]

    def noted(self, res: SearchResult) -> SearchResult:
        """`res` saying where the budget stopped the pricing while a plan it left unpriced might run faster:
        the limit under `bounded`, and that plan's floor as a lower bound."""
        if not (self.unpriced and self.open_floor < self.best_s * (1 - TIE)):
            return res
        low = min(self.open_floor, math.inf if res.lower_bound_s is None else res.lower_bound_s)
        return replace(res, bounded=[*res.bounded, f"ranking budget {self.budget:,} simulated actions "
                                     f"({self.unpriced} candidates not priced, lower bounds from "
                                     f"{self.open_floor:.4f} s)"], lower_bound_s=low)
