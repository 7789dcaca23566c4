"""Bridge from a plan (or search candidate) to the simulator, using the cost model's per-stage numbers."""
from __future__ import annotations

import math

from ..plan import Plan
from .costs import CostModel, StageSpec, micro_batches
from .makespan import makespan
from .simulator import SimResult, StageTimes, simulate


def stage_times(cm: CostModel, stages: list[StageSpec], dp: int) -> tuple[list[StageTimes], list[float]]:
    p = len(stages)
    out = []
    for k, s in enumerate(stages):
        pr = cm.profile.get(s.chip, s.tp)
        c = cm.coef(s.chip, s.tp, s.recompute, dp)
        fwd = s.layers * pr.fwd_s
        bwd = s.layers * (pr.bwd_s + (pr.recompute_s if s.recompute else 0.0))
        upd = s.layers * c.upd
        static, transient = s.layers * c.static, c.transient
        for flag, which in ((k == 0, "first"), (k == p - 1, "last")):
            if flag:
                e = cm.end(s.chip, s.tp, dp, which)
                # embedding/head work split 1:2 between forward and backward, none of it deferred
                fwd, bwd, upd = fwd + e.time / 3, bwd + 2 * e.time / 3, upd + e.upd
                static, transient = static + e.static, transient + e.transient
        out.append(StageTimes(fwd=fwd, bwd=bwd, wgrad=s.layers * pr.wgrad_s, update=upd, static_bytes=static,
                              act_bytes=s.layers * c.act, transient_bytes=transient))
    es = [cm.boundary(stages[k].chip, stages[k].tp, stages[k + 1].chip, stages[k + 1].tp, dp) for k in range(p - 1)]
    return out, es


def simulate_stages(cm: CostModel, stages: list[StageSpec], dp: int, schedule: str | None = None,
                    keep_timeline: bool = False, limit: float = math.inf) -> SimResult:
    st, es = stage_times(cm, stages, dp)
    return simulate(st, es, micro_batches(cm.train, dp), schedule or cm.train.schedule, keep_timeline, limit)


def iteration_time(cm: CostModel, stages: list[StageSpec], dp: int, schedule: str | None = None) -> float:
    """The simulated iteration time alone (makespan.py: the same recurrence, no event loop)."""
    st, es = stage_times(cm, stages, dp)
    return makespan(st, es, micro_batches(cm.train, dp), schedule or cm.train.schedule)


def plan_stages(plan: Plan) -> list[StageSpec]:
    return [StageSpec(s.chip, s.tp, s.layers, s.recompute) for s in plan.stages]


def simulate_plan(cm: CostModel, plan: Plan, schedule: str | None = None, keep_timeline: bool = False) -> SimResult:
    return simulate_stages(cm, plan_stages(plan), plan.dp, schedule or plan.schedule, keep_timeline)
