"""The micro-batch size searched rather than given (issue 30 item 4). The problem is planned at each candidate
size with the analytic profile rebuilt for it (a micro-batch of s sequences computes s times the tokens,
holds s times the activations and sends s times the bytes, and pays each message's latency once), and the
plan that simulates fastest wins. The global batch is the same at every size, so the iteration times
compare. Fewer, larger micro-batches pay fewer latencies and per-micro-batch costs; more, smaller ones
leave a smaller pipeline bubble and hold less memory in flight. A measured profile holds one size's times,
so searching the size takes the analytic profile."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from ..spec import Cluster, InfeasibleError, ModelSpec, TrainSpec
from .candidates import Progress
from .front_door import DEFAULT_BUDGET, Budget, PlanResult, plan
from .planning import make_problem

MAX_AUTO = 16  # candidate_sizes: powers of two up to this many sequences per micro-batch


def candidate_sizes(train: TrainSpec, limit: int = MAX_AUTO) -> list[int]:
    """The powers of two up to `limit` that divide the global batch (1 always does)."""
    return [s for s in (1 << j for j in range(limit.bit_length())) if s <= limit and train.global_batch % s == 0]


@dataclass(frozen=True)
class SizedPlan:
    result: PlanResult  # the fastest size's plan (its Plan.micro_batch_size is that size)
    times: dict[int, float]  # per size tried: its plan's simulated iteration time (inf: no plan fits)


def plan_micro_batch(cluster: Cluster, model: ModelSpec, train: TrainSpec, sizes: Sequence[int],
                     budget: Budget = DEFAULT_BUDGET, algo: str = "auto",
                     progress: Progress | None = None) -> SizedPlan:
    """The plan of the fastest micro-batch size in `sizes` (each a divisor of the global batch); on a tie,
    the smaller size. InfeasibleError where no size has a plan."""
    if not sizes:
        raise ValueError("plan_micro_batch: no micro-batch sizes; expected at least one")
    for s in sizes:
        if s < 1 or train.global_batch % s:
            raise ValueError(f"micro-batch size {s}: expected a positive divisor of the global batch "
                             f"({train.global_batch} sequences)")
    best: PlanResult | None = None
    best_s = math.inf
    times: dict[int, float] = {}
    why: list[str] = []
    for s in sorted(set(sizes)):
        pb = make_problem(cluster, model, replace(train, micro_batch_size=s))
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
