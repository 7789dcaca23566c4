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
from typing import Any, Mapping

from ..schedules import Action, Schedule, build, validate
from ..schedules.actions import Op, chunks_of, deps_done, mark_done


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


class CheckedSchedule(list[list[Action]]):
    """An action list that schedules.validate has passed (built_schedule's, shared: never changed)."""


def built_schedule(name: str, p: int, m: int, params: Mapping[str, Any]) -> Schedule:
    """A registered schedule with parameters, built and validated once per shape and parameters (the
    re-rank simulates every option of many plans)."""
    return _built_with(name, p, m, frozen_params(params))


def frozen_params(params: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Schedule parameters as a hashable key (lists become tuples)."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in params.items()))


@lru_cache(maxsize=256)
def _built_with(name: str, p: int, m: int, frozen: tuple[tuple[str, Any], ...]) -> CheckedSchedule:
    sched = build(name, p, m, {k: list(v) if isinstance(v, tuple) else v for k, v in frozen})
    validate(sched, m)
    return CheckedSchedule(sched)


def schedule_of(schedule: str | Schedule, p: int, m: int) -> Schedule:
    """A named schedule built for p stages and m micro-batches, or a given action list, validated."""
    if isinstance(schedule, str):
        return _built(schedule, p, m)
    if not isinstance(schedule, CheckedSchedule):
        validate(schedule, m)
    return schedule


def simulate(stages: list[StageTimes], boundary_s: list[float], micro_batches: int, schedule: str | Schedule,
             keep_timeline: bool = False, limit: float = math.inf, latency_s: list[float] | None = None) -> SimResult:
    """`boundary_s`: how long a transfer occupies boundary j's channel (bytes over bandwidth); `latency_s`:
    what it adds on top before it arrives, without occupying the channel (messages pipeline).
    `limit`: stop once some stage surely ends after it (iteration time inf, the rest partial).
    An interleaved schedule (chunks v > 1) on p stages takes `stages` and `boundary_s` per virtual stage
    (p * v of them, in pipeline order; virtual stage c * p + s is stage s's chunk c); times, memory and
    bubbles are reported per physical stage, and boundary j's transfers use the link from stage j % p to
    the next (stage p - 1's to stage 0 for the chunks' wrap-around)."""
    m = micro_batches
    if isinstance(schedule, str):
        p = len(stages)
        sched = schedule_of(schedule, p, m)
    else:
        sched = schedule_of(schedule, len(schedule), m)
        p = len(sched)
    v = chunks_of(sched)
    if len(stages) != p * v:
        raise ValueError(f"{len(stages)} stage times for {p} stages of {v} chunks each")
    vstages = stages
    for what, got in (("boundary_s", boundary_s), ("latency_s", latency_s)):
        if got is not None and len(got) != max(p * v - 1, 0):
            raise ValueError(f"{what}: {len(got)} values for the {max(p * v - 1, 0)} boundaries between "
                             f"{p * v} stages (one per boundary, in pipeline order)")
    lat = latency_s or [0.0] * max(p * v - 1, 0)
    stages = [StageTimes(fwd=0.0, bwd=0.0, wgrad=0.0, update=sum(vstages[c * p + s].update for c in range(v)),
                         static_bytes=sum(vstages[c * p + s].static_bytes for c in range(v)),
                         act_bytes=0.0, transient_bytes=max(vstages[c * p + s].transient_bytes for c in range(v)))
              for s in range(p)]
    free = [0.0] * p
    fwd_chan = [0.0] * p  # channel k: stage k -> k+1 (mod p)
    bwd_chan = [0.0] * p  # channel k: stage k+1 (mod p) -> k
    last = p * v - 1
    arrive: dict[tuple[int, Op, int], float] = {}
    pos = [0] * p
    live = [0.0] * p
    peak = [st.static_bytes + st.transient_bytes for st in stages]
    busy = [0.0] * p
    timeline: list[tuple[int, str, int, float, float]] = []
    remaining = sum(len(s) for s in sched)
    done_keys: set[tuple[int, Op, int]] = set()
    while remaining:
        progressed = False
        for s in range(p):
            while pos[s] < len(sched[s]):
                a: Action = sched[s][pos[s]]
                if not deps_done(a, s, p, done_keys, v):
                    break
                vs = a.chunk * p + s
                st = vstages[vs]
                ready = free[s]
                if a.op is Op.F and vs > 0:
                    ready = max(ready, arrive[(vs, Op.F, a.mb)])
                elif a.op in (Op.B, Op.I) and vs < last:
                    ready = max(ready, arrive[(vs, Op.B, a.mb)])
                dur = {Op.F: st.fwd, Op.B: st.bwd, Op.I: st.bwd - st.wgrad, Op.W: st.wgrad}[a.op]
                end = ready + dur
                free[s] = end
                if end + stages[s].update > limit:
                    return SimResult(math.inf, 0.0, peak, busy, timeline)
                busy[s] += dur
                if keep_timeline:
                    timeline.append((s, a.op, a.mb, ready, end))
                mark_done(a, s, p, done_keys)
                # memory: activations live from F until the pass that last reads them
                if a.op is Op.F:
                    live[s] += st.act_bytes
                    peak[s] = max(peak[s], stages[s].static_bytes + live[s] + stages[s].transient_bytes)
                elif a.op in (Op.B, Op.W):
                    live[s] -= st.act_bytes
                # point-to-point transfers (virtual boundary vs on the link from stage s to the next)
                if a.op is Op.F and vs < last:
                    start = max(end, fwd_chan[s])
                    fwd_chan[s] = start + boundary_s[vs]
                    arrive[(vs + 1, Op.F, a.mb)] = fwd_chan[s] + lat[vs]
                if a.op in (Op.B, Op.I) and vs > 0:
                    prev = (s - 1) % p
                    start = max(end, bwd_chan[prev])
                    bwd_chan[prev] = start + boundary_s[vs - 1]
                    arrive[(vs - 1, Op.B, a.mb)] = bwd_chan[prev] + lat[vs - 1]
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # validate() rules this out; kept as a guard
            raise RuntimeError("simulation made no progress")
    ends = [free[s] + stages[s].update for s in range(p)]
    T = max(ends)
    total_busy = sum(busy) + sum(st.update for st in stages)
    return SimResult(T, 1.0 - total_busy / (p * T) if T > 0 else 0.0, peak, busy, timeline)
