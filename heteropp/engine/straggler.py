"""A straggler is a fault too: each stage's compute time per step (its F, B, I and W actions) against what the
plan's cost model predicted for it (`est_time_s` per micro-batch, times the step's micro-batches). In a plan
of replica groups every group's stages are watched together, each against its own group's micro-batches (a
watch slot per stage of each group, groups in rank order).

The prediction's absolute scale may be off for every chip alike (a loaded host, an analytic profile), so each
stage's ratio measured / predicted is judged against the median ratio of the other stages (ResiHP's
normalisation; a one-stage plan has nothing to compare with),
and over the median of a window of steps, so one long step or micro-batch is no alarm: a stage is a straggler
when its windowed ratio exceeds `threshold` times the others' median.

What happens then is the round's: `StragglerWatch.policy` (None: report only) is called with the stragglers
found at each step that finds some; an elastic round (heteropp.engine.elastic) sets one that re-plans when
that pays."""
from __future__ import annotations

import statistics
import time
from collections import deque
from typing import Any, Callable, ClassVar

import torch
import torch.distributed as dist

from ..plan import Plan

WINDOW, THRESHOLD = 5, 1.5


class StragglerWatch:
    # called as policy(watch, stragglers) on every rank alike (the stragglers come from one all-reduce)
    policy: ClassVar[Callable[["StragglerWatch", dict[int, float]], Any] | None] = None

    def __init__(self, plan: Plan, window: int = WINDOW, threshold: float = THRESHOLD) -> None:
        self.plan, self.threshold = plan, threshold
        # per slot (a group of chips of one replica group's pipeline): its predicted compute per step (its
        # chunks' estimates, every micro-batch of its group; None where the plan carries no estimate, as
        # hand-written plans), its chip type and (group, stage)
        self.predicted: list[float | None] = []
        self.chips: list[str] = []
        self.where: list[tuple[int, int]] = []
        self.first_slot: list[int] = []  # per replica group: its stage 0's slot
        for i, g in enumerate(plan.groups):
            n, p = len(g.stages), g.devices
            self.first_slot.append(len(self.predicted))
            for k in range(p):
                ests = [g.stages[vs].est_time_s for vs in range(k, n, p)]
                self.predicted.append(sum(ests) * g.micro_batches if all(ests) else None)  # type: ignore[arg-type]
                self.chips.append(g.stages[k].chip)
                self.where.append((i, k))
        self.history: deque[list[float]] = deque(maxlen=window)
        self.calls = 0  # steps observed
        self.first_at = 0.0  # when the first step was observed (time.time())
        self.ends: deque[float] = deque(maxlen=window + 1)  # when each of the last steps was observed

    def slot_of(self, group: int, stage: int) -> int:
        """The slot of stage `stage` (a group of chips) of replica group `group` (0 for a plan of one list)."""
        return self.first_slot[group] + stage

    def step_s(self) -> float:
        """The median wall time of a step over the window (0 before two steps)."""
        e = list(self.ends)
        return statistics.median(b - a for a, b in zip(e, e[1:])) if len(e) > 1 else 0.0

    def observe(self, slot: int, compute_s: float, lead: bool) -> dict[int, float]:
        """Every rank calls this once per step with its slot (slot_of; a plan of one stage list: its stage) and
        whether it reports it (one small MAX all-reduce over the world); returns {slot: slowdown vs the median
        slot} for the slots judged stragglers now. A plan without estimates (every rank sees the same plan) is
        not judged, and costs no collective."""
        self.calls += 1
        self.first_at = self.first_at or time.time()
        self.ends.append(time.perf_counter())
        slots = len(self.predicted)
        if None in self.predicted or slots < 2:
            return {}
        v = torch.zeros(slots, dtype=torch.float64)
        if lead:
            v[slot] = compute_s
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(v, op=dist.ReduceOp.MAX)
        self.history.append(v.tolist())
        if len(self.history) < (self.history.maxlen or 1):
            return {}
        windowed = [statistics.median(h[k] for h in self.history) for k in range(slots)]
        ratios = [w / p for w, p in zip(windowed, self.predicted)]  # type: ignore[operator]
        out = {}
        for k, r in enumerate(ratios):
            others = ratios[:k] + ratios[k + 1:]
            mid = statistics.median(others) if others else 0.0
            if mid > 0 and r / mid > self.threshold:
                out[k] = r / mid
        if out and StragglerWatch.policy is not None:
            StragglerWatch.policy(self, out)
        return out
