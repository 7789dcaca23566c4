"""Iteration time of a pipeline schedule without the event loop: the simulator's recurrence, unrolled.

Every compute action starts when its stage is free and its input has arrived; a boundary channel carries one
transfer at a time in the sender's order. Those are longest-path equations over the schedule's actions, so
one pass in any dependency-respecting order (found once per schedule shape) gives the simulator's iteration
time exactly, at a fraction of its cost (no dictionaries, no readiness checks). The re-rank uses it; the
simulator stays the judge that also reports memory, bubbles and the timeline (tests check they agree).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping

from ..schedules.actions import deps_done
from .simulator import StageTimes, _built, _built_with, frozen_params

_OPS = {"F": 0, "B": 1, "I": 2, "W": 3}


@lru_cache(maxsize=256)
def program(schedule: str, p: int, m: int, frozen: tuple = ()) -> tuple[tuple[int, int, int], ...]:
    """(stage, op code, micro-batch) of every compute action, in an order that respects all dependencies;
    `frozen`: the schedule's parameters (simulator.built_schedule's key)."""
    built = _built_with(schedule, p, m, frozen) if frozen else _built(schedule, p, m)
    sched = [[a for a in acts if a.op in _OPS] for acts in built]
    done: set[tuple[int, str, int]] = set()
    pos, out = [0] * p, []
    while len(out) < sum(map(len, sched)):
        for s in range(p):
            while pos[s] < len(sched[s]) and deps_done(a := sched[s][pos[s]], s, p, done):
                done.add((s, "B" if a.op == "I" else a.op, a.mb))
                if a.op == "I":
                    done.add((s, "I", a.mb))
                out.append((s, _OPS[a.op], a.mb))
                pos[s] += 1
    return tuple(out)


def makespan(stages: list[StageTimes], boundary_s: list[float], micro_batches: int, schedule: str,
             latency_s: list[float] | None = None, params: Mapping[str, Any] | None = None) -> float:
    """The simulator's iteration time (last stage update end) for a named schedule with its parameters
    (one model chunk per stage)."""
    p, m = len(stages), micro_batches
    lat = latency_s or [0.0] * p
    dur = [(st.fwd, st.bwd, st.bwd - st.wgrad, st.wgrad) for st in stages]
    free = [0.0] * p
    fch = [0.0] * p  # forward channel s: stage s -> s+1
    bch = [0.0] * p  # backward channel s: stage s+1 -> s
    arr_f = [0.0] * (p * m)  # when micro-batch j's activations reach stage s
    arr_b = [0.0] * (p * m)  # when its gradients reach stage s
    last = p - 1
    for s, op, j in program(schedule, p, m, frozen_params(params or {})):
        t = free[s]
        if op == 0:
            if s and arr_f[s * m + j] > t:
                t = arr_f[s * m + j]
            t += dur[s][0]
            if s < last:
                c = (t if t > fch[s] else fch[s]) + boundary_s[s]
                fch[s] = c
                arr_f[(s + 1) * m + j] = c + lat[s]
        elif op < 3:
            if s < last and arr_b[s * m + j] > t:
                t = arr_b[s * m + j]
            t += dur[s][op]
            if s:
                c = (t if t > bch[s - 1] else bch[s - 1]) + boundary_s[s - 1]
                bch[s - 1] = c
                arr_b[(s - 1) * m + j] = c + lat[s - 1]
        else:
            t += dur[s][3]
        free[s] = t
    return max(f + st.update for f, st in zip(free, stages))
