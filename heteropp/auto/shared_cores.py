"""A plan's schedule when its chips are processes sharing one host's cores (processor sharing).

On a cluster the stages of a pipeline run on separate chips; in the demo and the benchmarks on one machine
they are processes time-sharing its cores. Then a stage computes at full speed only while at most `cores`
ranks compute at once; with more, every computing rank gets cores / (ranks computing) of a core, and idle
stages (waiting in a bubble) free their share. A stage occupies tp x dp ranks while it computes. Profiles
stay those of one stage alone, which are stable, instead of profiles taken under a guessed contention.

Fair sharing is the ideal; a host loses some throughput to the sharing itself (context switches, caches
refilled, a TP partner descheduled at a collective). `slowdown`, when given, is measured instead: entry k-1
is how much longer a compute step takes while k ranks compute at once than alone; a stage whose entries
were timed with its own tp ranks running is scaled by slowdown(k) / slowdown(its ranks). Beyond the table,
the last entry grows in proportion to k.

Otherwise the rules of simulator.simulate: each stage runs its actions in list order once their
dependencies (schedules.actions.deps_done) are met and their input has arrived; each boundary is two
one-way FIFO channels with a fixed transfer time; a stage's update follows its last action. With at least
as many cores as ranks the result equals simulator.simulate's iteration time.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from ..schedules import Action, Schedule
from ..schedules.actions import Op, deps_done
from .simulator import StageTimes, schedule_of

_EPS = 1e-12


def _duration(st: StageTimes, a: Action | None) -> float:
    if a is None:
        return st.update
    return {Op.F: st.fwd, Op.B: st.bwd, Op.I: st.bwd - st.wgrad, Op.W: st.wgrad}[a.op]


def _slowdown_fn(slowdown: Sequence[float] | None, cores: float) -> Callable[[int], float]:
    if slowdown is None:
        return lambda k: max(1.0, k / cores)
    table = [float(x) for x in slowdown]
    if not table or any(not x > 0 for x in table):
        raise ValueError(f"slowdown must list positive factors for 1, 2, ... ranks computing, got {slowdown}")
    return lambda k: table[k - 1] if k <= len(table) else table[-1] * k / len(table)


def simulate_shared_cores(stages: list[StageTimes], boundary_s: list[float], micro_batches: int,
                          schedule: str | Schedule, ranks: list[int], cores: float,
                          slowdown: Sequence[float] | None = None, tp: list[int] | None = None) -> float:
    """Iteration time of one step. `ranks[k]`: processes stage k keeps busy while computing (tp x dp);
    `cores`: the cores they share (math.inf: no sharing); `slowdown`: measured factors (module doc), which
    then stand for fair sharing of `cores` (it is not used); `tp[k]`: the ranks stage k's entries were timed
    with (default 1 each)."""
    p, m = len(stages), micro_batches
    if len(ranks) != p or any(r < 1 for r in ranks):
        raise ValueError(f"ranks must give each of the {p} stages at least one process, got {ranks}")
    if not cores > 0:
        raise ValueError(f"cores must be positive, got {cores}")
    tp = [1] * p if tp is None else tp
    if len(tp) != p or any(t < 1 for t in tp):
        raise ValueError(f"tp must give each of the {p} stages a size of at least 1, got {tp}")
    slow = _slowdown_fn(slowdown, cores)
    sched = schedule_of(schedule, p, m)
    pos = [0] * p
    updated = [False] * p
    finish = [0.0] * p
    running: dict[int, list[Any]] = {}  # stage -> [action (None: the update), remaining work in seconds alone]
    done: set[tuple[int, Op, int]] = set()
    arrive: dict[tuple[int, Op, int], float] = {}
    fwd_chan = [0.0] * max(p - 1, 0)
    bwd_chan = [0.0] * max(p - 1, 0)
    now = 0.0

    def startable(s: int) -> list[Any] | None:
        if pos[s] == len(sched[s]):
            if updated[s]:
                return None
            updated[s] = True
            return [None, stages[s].update]
        a = sched[s][pos[s]]
        if not deps_done(a, s, p, done):
            return None
        key = None  # the transfer this action waits for, if any
        if a.op is Op.F and s > 0:
            key = (s, Op.F, a.mb)
        elif a.op in (Op.B, Op.I) and s < p - 1:
            key = (s, Op.B, a.mb)
        if key is not None and arrive[key] > now + _EPS:
            return None
        return [a, _duration(stages[s], a)]

    def complete(s: int, a: Action | None) -> None:
        if a is None:
            finish[s] = now
            return
        pos[s] += 1
        key = Op.B if a.op is Op.I else a.op
        done.add((s, key, a.mb))
        if a.op is Op.I:
            done.add((s, Op.I, a.mb))
        if a.op is Op.F and s < p - 1:
            fwd_chan[s] = max(now, fwd_chan[s]) + boundary_s[s]
            arrive[(s + 1, Op.F, a.mb)] = fwd_chan[s]
        if a.op in (Op.B, Op.I) and s > 0:
            bwd_chan[s - 1] = max(now, bwd_chan[s - 1]) + boundary_s[s - 1]
            arrive[(s - 1, Op.B, a.mb)] = bwd_chan[s - 1]

    while True:
        for s in range(p):
            if s not in running and (task := startable(s)) is not None:
                running[s] = task
        pending = [t for t in arrive.values() if t > now + _EPS]
        if not running:
            if all(updated) and all(pos[s] == len(sched[s]) for s in range(p)):
                return max(finish)
            if not pending:  # validate() rules this out; kept as a guard
                raise RuntimeError("shared-cores simulation made no progress")
            now = min(pending)
            continue
        busy = slow(sum(ranks[s] for s in running))
        rate = {s: min(1.0, slow(tp[s]) / busy) for s in running}
        step = min(rem / rate[s] for s, (_, rem) in running.items())
        if pending:  # an arrival may let an idle stage start (and change everyone's share)
            step = min(step, min(pending) - now)
        now += step
        for s in list(running):
            task = running[s]
            task[1] -= step * rate[s]
            if task[1] <= _EPS * max(1.0, abs(now)):
                del running[s]
                complete(s, task[0])
