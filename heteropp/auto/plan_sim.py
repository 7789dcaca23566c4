"""Bridge from a plan (or search candidate) to the simulator, using the cost model's per-stage numbers."""
from __future__ import annotations

import math
from typing import Any

from ..plan import Plan
from ..spec.placement import PlacementError
from ..schedules import h1f1b_extra, harp_launch_extra, kind
from .costs import CostModel, StageSpec, micro_batches
from .makespan import makespan
from .simulator import SimResult, StageTimes, built_schedule, simulate


def stage_times(cm: CostModel, stages: list[StageSpec], dp: int,
                chunks: int = 1) -> tuple[list[StageTimes], list[float]]:
    """The stages' times and bytes as the simulator runs them (CostModel.stage_times); `chunks`: the stages
    are an interleaved schedule's virtual stages."""
    return cm.stage_times(stages, dp, chunks)


def schedule_params(cm: CostModel, stages: list[StageSpec], dp: int, schedule: str) -> dict[str, Any]:
    """Parameters of a schedule that takes some, derived from the plan's costs (H-1F1B: HARP's extra
    warm-up per boundary from its transfer time over the bottleneck stage's compute)."""
    if "extra_warmup" not in kind(schedule).params:
        return {}  # interleaved 1F1B's chunks come with the plan's virtual stages, not from costs
    st, es = stage_times(cm, stages, dp)
    return {"extra_warmup": h1f1b_extra([t.fwd + t.bwd for t in st], es)}


def launch_warmup(cm: CostModel, stages: list[StageSpec], dp: int) -> list[int]:
    """H-1F1B's extra warm-up as HARP's code launches it (harp_launch_extra): a boundary between two chip
    types joins two clusters, and its cost is its transfer plus its latency."""
    st, es = stage_times(cm, stages, dp)
    costs = [e + lat for e, lat in zip(es, latencies(cm, stages))]
    return harp_launch_extra([t.fwd + t.bwd for t in st], costs, [a.chip != b.chip for a, b in zip(stages, stages[1:])])


def simulate_stages(cm: CostModel, stages: list[StageSpec], dp: int, schedule: str | None = None,
                    keep_timeline: bool = False, limit: float = math.inf,
                    params: dict[str, Any] | None = None) -> SimResult:
    """`params`: the schedule's parameters; derived from the costs (schedule_params) when it needs some
    and none are given."""
    name, b = schedule or cm.train.schedule, micro_batches(cm.train, dp)
    sched: str | list[Any] = name
    chunks = 1
    if kind(name).params:
        params = params or schedule_params(cm, stages, dp, name)
        chunks = kind(name).chunks(params)
        sched = built_schedule(name, len(stages) // chunks, b, params)
    st, es = stage_times(cm, stages, dp, chunks)
    return simulate(st, es, b, sched, keep_timeline, limit, latencies(cm, stages))


def iteration_time(cm: CostModel, stages: list[StageSpec], dp: int, schedule: str | None = None,
                   params: dict[str, Any] | None = None) -> float:
    """The simulated iteration time alone (makespan.py: the same recurrence, no event loop); `stages`:
    the virtual stages where the schedule interleaves."""
    name = schedule or cm.train.schedule
    chunks = kind(name).chunks(params) if params is not None and kind(name).params else 1
    st, es = stage_times(cm, stages, dp, chunks)
    return makespan(st, es, micro_batches(cm.train, dp), name, latencies(cm, stages), params)


def compute_floor(cm: CostModel, stages: list[StageSpec], dp: int) -> float:
    """A lower bound on the simulated iteration time under any schedule of these (physical) stages, at a
    fraction of a simulation's cost: stage k cannot start before the first micro-batch's forwards through
    the stages before it and their transfers, then computes every micro-batch's forward and backward, then
    updates. inf where a TP group fits in no node (no time of such a plan exists)."""
    try:
        st, es = stage_times(cm, stages, dp)
    except PlacementError:
        return math.inf
    b, lat = micro_batches(cm.train, dp), latencies(cm, stages)
    best, before = 0.0, 0.0
    for k, t in enumerate(st):
        best = max(best, before + b * (t.fwd + t.bwd) + t.update)
        if k < len(es):
            before += t.fwd + es[k] + lat[k]
    return best


def latencies(cm: CostModel, stages: list[StageSpec]) -> list[float]:
    """Per boundary, the message latency between the two stages' chip types."""
    return [cm.latency(a.chip, b.chip) for a, b in zip(stages, stages[1:])]


def plan_stages(plan: Plan) -> list[StageSpec]:
    return [StageSpec(s.chip, s.tp, s.layers, s.recompute, s.inner_dp) for s in plan.stages]


def simulate_plan(cm: CostModel, plan: Plan, schedule: str | None = None, keep_timeline: bool = False) -> SimResult:
    if plan.replicas:
        raise ValueError("a plan whose replicas run different pipelines is priced by replica_sim.simulate_groups")
    name = schedule or plan.schedule
    return simulate_stages(cm, plan_stages(plan), plan.dp, name, keep_timeline,
                           params=plan.schedule_params if name == plan.schedule else None)
