"""Discrete-event execution of one pipeline replica's schedule (the action lists of heteropp.schedules).

Each stage runs its compute actions in list order; an action starts when the stage is free and its inputs
have arrived. A boundary is two one-way channels (activations forward, gradients backward), each carrying one
transfer at a time in the sender's order. After its last action a stage runs its update (data-parallel
gradient sync + optimizer). Memory: weights plus the activations of every micro-batch whose forward has run
and whose backward (B, or W under ZB-H1) has not.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from ..schedules import Action, Schedule, build, validate
from ..schedules.actions import deps_done


@dataclass(frozen=True)
class StageTimes:
    fwd: float  # per micro-batch, including embedding/head where the stage has them
    bwd: float  # full backward (recompute included); I + W when split
    wgrad: float  # the W part of bwd
    update: float
    static_bytes: float = 0.0
    act_bytes: float = 0.0  # per micro-batch
    transient_bytes: float = 0.0


@dataclass
class SimResult:
    iteration_time_s: float
    bubble_fraction: float
    peak_memory_bytes: list[float]
    busy_s: list[float]
    timeline: list[tuple[int, str, int, float, float]] = field(default_factory=list)  # stage, op, mb, start, end


@lru_cache(maxsize=64)
def _built(schedule: str, p: int, m: int) -> Schedule:
    """A named schedule, built and validated once per shape (the re-rank simulates many plans of one shape)."""
    sched = build(schedule, p, m)
    validate(sched, m)
    return sched


def schedule_of(schedule: str | Schedule, p: int, m: int) -> Schedule:
    """A named schedule built for p stages and m micro-batches, or a given action list, validated."""
    if isinstance(schedule, str):
        return _built(schedule, p, m)
    validate(schedule, m)
    return schedule


def simulate(stages: list[StageTimes], boundary_s: list[float], micro_batches: int, schedule: str | Schedule,
             keep_timeline: bool = False, limit: float = math.inf, latency_s: list[float] | None = None) -> SimResult:
    """`boundary_s`: how long a transfer occupies boundary j's channel (bytes over bandwidth); `latency_s`:
    what it adds on top before it arrives, without occupying the channel (messages pipeline).
    `limit`: stop once some stage surely ends after it (iteration time inf, the rest partial)."""
    p, m = len(stages), micro_batches
    lat = latency_s or [0.0] * max(p - 1, 0)
    sched = schedule_of(schedule, p, m)
    done: dict[tuple[int, str, int], float] = {}  # finish times; "B" also marks I
    free = [0.0] * p
    fwd_chan = [0.0] * max(p - 1, 0)  # channel k: stage k -> k+1
    bwd_chan = [0.0] * max(p - 1, 0)  # channel k: stage k+1 -> k
    arrive: dict[tuple[int, str, int], float] = {}
    pos = [0] * p
    live = [0] * p
    peak = [st.static_bytes + st.transient_bytes for st in stages]
    busy = [0.0] * p
    timeline: list[tuple[int, str, int, float, float]] = []
    remaining = sum(len(s) for s in sched)
    done_keys: set[tuple[int, str, int]] = set()
    while remaining:
        progressed = False
        for s in range(p):
            while pos[s] < len(sched[s]):
                a: Action = sched[s][pos[s]]
                if not deps_done(a, s, p, done_keys):
                    break
                st = stages[s]
                ready = free[s]
                if a.op == "F" and s > 0:
                    ready = max(ready, arrive[(s, "F", a.mb)])
                elif a.op in ("B", "I") and s < p - 1:
                    ready = max(ready, arrive[(s, "B", a.mb)])
                dur = {"F": st.fwd, "B": st.bwd, "I": st.bwd - st.wgrad, "W": st.wgrad}[a.op]
                end = ready + dur
                free[s] = end
                if end + st.update > limit:
                    return SimResult(math.inf, 0.0, peak, busy, timeline)
                busy[s] += dur
                if keep_timeline:
                    timeline.append((s, a.op, a.mb, ready, end))
                key = "B" if a.op == "I" else a.op
                done[(s, key, a.mb)] = end
                done_keys.add((s, key, a.mb))
                if a.op == "I":
                    done_keys.add((s, "I", a.mb))
                # memory: activations live from F until the pass that last reads them
                if a.op == "F":
                    live[s] += 1
                    peak[s] = max(peak[s], st.static_bytes + live[s] * st.act_bytes + st.transient_bytes)
                elif a.op in ("B", "W"):
                    live[s] -= 1
                # point-to-point transfers
                if a.op == "F" and s < p - 1:
                    start = max(end, fwd_chan[s])
                    fwd_chan[s] = start + boundary_s[s]
                    arrive[(s + 1, "F", a.mb)] = fwd_chan[s] + lat[s]
                if a.op in ("B", "I") and s > 0:
                    start = max(end, bwd_chan[s - 1])
                    bwd_chan[s - 1] = start + boundary_s[s - 1]
                    arrive[(s - 1, "B", a.mb)] = bwd_chan[s - 1] + lat[s - 1]
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # validate() rules this out; kept as a guard
            raise RuntimeError("simulation made no progress")
    ends = [free[s] + stages[s].update for s in range(p)]
    T = max(ends)
    total_busy = sum(busy) + sum(st.update for st in stages)
    return SimResult(T, 1.0 - total_busy / (p * T) if T > 0 else 0.0, peak, busy, timeline)
