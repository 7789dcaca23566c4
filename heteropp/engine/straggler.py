"""A straggler is a fault too: each stage's compute time per step (its F, B, I and W actions) against what the
plan's cost model predicted for it (`est_time_s` per micro-batch, times the step's micro-batches).

The prediction's absolute scale may be off for every chip alike (a loaded host, an analytic profile), so each
stage's ratio measured / predicted is judged against the median ratio of the other stages (ResiHP's
normalisation; a one-stage plan has nothing to compare with),
and over the median of a window of steps, so one long step or micro-batch is no alarm: a stage is a straggler
when its windowed ratio exceeds `threshold` times the others' median."""
from __future__ import annotations

import statistics
from collections import deque

import torch
import torch.distributed as dist

from ..plan import Plan

WINDOW, THRESHOLD = 5, 1.5


class StragglerWatch:
    def __init__(self, plan: Plan, window: int = WINDOW, threshold: float = THRESHOLD) -> None:
        self.plan, self.threshold = plan, threshold
        n, p = len(plan.stages), plan.devices
        # a group of chips' predicted compute per step (its chunks' estimates, every micro-batch); None where the
        # plan carries no estimate (hand-written plans)
        self.predicted: list[float | None] = []
        for k in range(p):
            ests = [plan.stages[vs].est_time_s for vs in range(k, n, p)]
            self.predicted.append(sum(ests) * plan.micro_batches if all(ests) else None)  # type: ignore[arg-type]
        self.history: deque[list[float]] = deque(maxlen=window)

    def observe(self, stage: int, compute_s: float, lead: bool) -> dict[int, float]:
        """Every rank calls this once per step (one small MAX all-reduce over the world); returns
        {stage: slowdown vs the median stage} for the stages judged stragglers now. A plan without estimates
        (every rank sees the same plan) is not judged, and costs no collective."""
        if None in self.predicted or self.plan.devices < 2:
            return {}
        v = torch.zeros(self.plan.devices, dtype=torch.float64)
        if lead:
            v[stage] = compute_s
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(v, op=dist.ReduceOp.MAX)
        self.history.append(v.tolist())
        if len(self.history) < (self.history.maxlen or 1):
            return {}
        windowed = [statistics.median(h[k] for h in self.history) for k in range(self.plan.devices)]
        ratios = [w / p for w, p in zip(windowed, self.predicted)]  # type: ignore[operator]
        out = {}
        for k, r in enumerate(ratios):
            others = ratios[:k] + ratios[k + 1:]
            mid = statistics.median(others) if others else 0.0
            if mid > 0 and r / mid > self.threshold:
                out[k] = r / mid
        return out
