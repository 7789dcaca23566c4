"""The micro-batch size searched rather than given (issue 30 item 4). Each candidate size gets its own problem:
the analytic profile rebuilt for it (a micro-batch of s sequences computes s times the tokens, holds s times
the activations and sends s times the bytes, and pays each message's latency once), or a measured profile
of that size (`heteroauto profile --micro-batch-size s`, one file per size). Every size's candidates (its
search's and its baselines') then go into the one ranking step's pool (planning.run_sized, ranking.py),
each priced under its own size, and the fastest plan wins. The global batch is the same at every size, so
the iteration times compare. Fewer, larger micro-batches pay fewer latencies and per-micro-batch costs;
more, smaller ones leave a smaller pipeline bubble and hold less memory in flight.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from ..spec import Cluster, InfeasibleError, ModelSpec, TrainSpec
from .candidates import Progress
from .front_door import DEFAULT_BUDGET, Budget, PlanResult, plan
from .planning import Problem, make_problem, run_sized, to_plan
from .profiles import Profile

MAX_AUTO = 16  # candidate_sizes: powers of two up to this many sequences per micro-batch


def candidate_sizes(train: TrainSpec, limit: int = MAX_AUTO) -> list[int]:
    """The powers of two up to `limit` that divide the global batch (1 always does)."""
    return [s for s in (1 << j for j in range(limit.bit_length())) if s <= limit and train.global_batch % s == 0]


@dataclass(frozen=True)
class SizedPlan:
    result: PlanResult  # the fastest size's plan (its Plan.micro_batch_size is that size)
    # per size tried: the fastest of its plans the ranking priced (inf: none fits, or none could beat the winner)
    times: dict[int, float]


def plan_micro_batch(cluster: Cluster, model: ModelSpec, train: TrainSpec, sizes: Sequence[int],
                     budget: Budget = DEFAULT_BUDGET, algo: str = "auto", progress: Progress | None = None,
                     profiles: Mapping[int, Profile] | None = None, profile_source: str | None = None) -> SizedPlan:
    """The plan of the fastest micro-batch size in `sizes` (each a divisor of the global batch); on a tie,
    the smaller size. `profiles`: measured profiles by micro-batch size, one for every size in `sizes`
    (default: the analytic profile of each size). InfeasibleError where no size has a plan."""
    if not sizes:
        raise ValueError("plan_micro_batch: no micro-batch sizes; expected at least one")
    for s in sizes:
        if s < 1 or train.global_batch % s:
            raise ValueError(f"micro-batch size {s}: expected a positive divisor of the global batch "
                             f"({train.global_batch} sequences)")
    if profiles is not None:
        missing = sorted(set(sizes) - set(profiles))
        if missing:
            raise ValueError(f"micro-batch sizes {', '.join(map(str, missing))}: no measured profile of that size "
                             f"(the profiles hold {', '.join(map(str, sorted(profiles))) or 'none'}); expected one "
                             "profile per size searched (heteroauto profile --micro-batch-size)")
    # profile_source: the files the profiles were read from, named where one does not fit (planning.make_problem)
    problems = {s: make_problem(cluster, model, replace(train, micro_batch_size=s),
                                profiles[s] if profiles is not None else None,
                                profile_source=profile_source and f"{profile_source} (micro-batch size {s})")
                for s in sorted(set(sizes))}
    if algo != "auto":
        return _each_size(problems, budget, algo, progress)
    t0, c0 = time.perf_counter(), time.process_time()
    pb, res, times = run_sized(problems, budget.group_size, progress, budget.limits, budget.idle, budget.baselines,
                               budget.rank_actions)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    if progress:
        for s, t in times.items():
            progress(f"micro-batch size {s}: " + (f"{t:.4f} s per iteration" if t < math.inf else "no plan faster"))
    return SizedPlan(PlanResult(to_plan(pb, res.best, dt, algo, res), res, dt, cpu), times)


def _each_size(problems: dict[int, Problem], budget: Budget, algo: str, progress: Progress | None) -> SizedPlan:
    """A whole plan per size (h2's algorithm, which has no pool), the fastest kept."""
    best: PlanResult | None = None
    best_s = math.inf
    times: dict[int, float] = {}
    why: list[str] = []
    for s, pb in problems.items():
        try:
            got = plan(pb, budget, algo)
        except InfeasibleError as e:
            times[s] = math.inf
            why.append(f"{s}: {e}")
            continue
        t = got.plan.iteration_time_s
        times[s] = math.inf if t is None else t
        if progress:
            progress(f"micro-batch size {s}: {times[s]:.4f} s per iteration")
        if best is None or times[s] < best_s:
            best, best_s = got, times[s]
    if best is None:
        raise InfeasibleError("no micro-batch size gives a plan: " + "; ".join(why))
    return SizedPlan(best, times)
