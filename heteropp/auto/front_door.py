"""HeteroAuto's one entry point: a problem (cluster, model, training, cost model) and a budget in, the plan
and how it was found out. The CLI, the benchmarks and the tests call this instead of repeating the
load / search / to_plan sequence."""
from __future__ import annotations

import time
from dataclasses import dataclass

from ..plan import Plan
from .candidates import Progress, SearchResult
from .limits import DEFAULT_WORK, IDLE_MODES, Limits
from .planning import Problem, run_search, to_plan
from .ranking import RANK_ACTIONS


@dataclass(frozen=True)
class Budget:
    """How far `plan` searches. `work`: units of search work (limits.BOUND_CELLS_PER_UNIT), never seconds,
    so the same inputs give the same plan on any machine under any load; the default makes every H2 paper
    experiment and HARP setting exact. `time_cap_s`: an optional wall-clock cap on top, which makes the plan
    depend on the machine's load (a result it cut says so in SearchResult.bounded). `baselines`: check the
    plan against the cheap baselines (baselines.py) and return the fastest; `idle`: limits.IDLE_MODES;
    `group_size`: h2's chips per group (the paper's 128). `rank_actions`: the one ranking step's budget
    (ranking.py: simulated actions for pricing the pool of candidates and the local search)."""
    work: int = DEFAULT_WORK
    time_cap_s: float | None = None
    baselines: bool = True
    idle: str = "auto"
    group_size: int = 128
    rank_actions: int = RANK_ACTIONS

    def __post_init__(self) -> None:
        if self.work < 1:
            raise ValueError(f"Budget.work: {self.work}; expected a positive number of work units")
        if self.time_cap_s is not None and not self.time_cap_s > 0:
            raise ValueError(f"Budget.time_cap_s: {self.time_cap_s}; expected seconds above 0, or None")
        if self.idle not in IDLE_MODES:
            raise ValueError(f"Budget.idle: {self.idle!r}; expected one of {', '.join(IDLE_MODES)}")
        if self.rank_actions < 1:
            raise ValueError(f"Budget.rank_actions: {self.rank_actions}; expected a positive number of simulated "
                             "actions")
        if self.group_size < 1:
            raise ValueError(f"Budget.group_size: {self.group_size}; expected at least 1 chip")

    @property
    def limits(self) -> Limits:
        return Limits(work=self.work, time_cap_s=self.time_cap_s)


DEFAULT_BUDGET = Budget()


@dataclass(frozen=True)
class PlanResult:
    plan: Plan  # the shared plan schema, its time the simulator's
    search: SearchResult  # the search's statistics, whether it was exact, and the runners-up
    search_time_s: float  # wall clock
    cpu_time_s: float  # this process's CPU time


def plan(problem: Problem, budget: Budget = DEFAULT_BUDGET, algo: str = "auto",
         progress: Progress | None = None) -> PlanResult:
    """The best plan `algo` finds for `problem` within `budget` ("auto"; "h2": the paper's algorithm)."""
    t0, c0 = time.perf_counter(), time.process_time()
    res = run_search(problem, algo, budget.group_size, progress, budget.limits, budget.idle,
                     baselines=budget.baselines, rank_actions=budget.rank_actions)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return PlanResult(to_plan(problem, res.best, dt, algo, res), res, dt, cpu)
