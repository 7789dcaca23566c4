"""A lower bound of a schedule's simulated iteration time from the chains of actions it must run: the cost
model's estimate of interleaved 1F1B, whose virtual stages wrap around the pipeline (a micro-batch crosses
every link once per chunk each way, the last stage's link to the first one less) so that no closed form of
alternating.py's kind covers its round trips.

The simulator's time is the longest chain of compute actions, hops (a transfer's time and latency) and
waits in channel queues. Relaxing the queues of all links but one keeps every chain whose queue waits fall
on that link, each one the simulator must run, so the relaxation's time (makespan.compute_ends with
`queued`) is a lower bound; the estimate is the longest over the links, with no queue at all as well.
Only links whose channels can queue need their own pass: a channel never queues where each transfer takes
no longer than its sender's next sending action, which starts after the transfer's own sender action ends
(the next transfer is then sent only after this one has arrived). Where at most one link can queue, the
bound is the simulator's time.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..schedules.registry import kind
from .makespan import compute_ends
from .simulator import StageTimes


def queueing_links(stages: list[StageTimes], boundary_s: list[float], p: int) -> list[int]:
    """The links s (stage s to s + 1, modulo the p stages) with a channel where a transfer may outlast its
    sender's next sending action. `stages`, `boundary_s`: per virtual stage (virtual stage u is stage u % p,
    and boundary u from virtual stage u to u + 1 crosses link u % p)."""
    n = len(stages)
    fwd, bwd = [float("inf")] * p, [float("inf")] * p  # per link: its senders' shortest sending action
    for u, st in enumerate(stages):
        if u < n - 1:
            fwd[u % p] = min(fwd[u % p], st.fwd)
        if u:
            bwd[(u - 1) % p] = min(bwd[(u - 1) % p], st.bwd - st.wgrad)
    return sorted({u % p for u, e in enumerate(boundary_s) if e > fwd[u % p] or e > bwd[u % p]})


def chain_bound(stages: list[StageTimes], boundary_s: list[float], micro_batches: int, schedule: str,
                latency_s: list[float] | None = None, params: Mapping[str, Any] | None = None) -> tuple[float, str]:
    """The longest chain (module docstring) to the end of the last update, and where its queue waits fall:
    "chains" (nowhere) or "link s->s+1". `stages`, `boundary_s`, `latency_s`: per virtual stage, as
    simulator.simulate takes them."""
    v = kind(schedule).chunks(params or {})
    p = len(stages) // v
    upd = [sum(stages[c * p + s].update for c in range(v)) for s in range(p)]
    best, where = -float("inf"), ""
    for link in [None, *queueing_links(stages, boundary_s, p)]:
        ends = compute_ends(stages, boundary_s, micro_batches, schedule, latency_s, params,
                            queued=() if link is None else (link,))
        t = max(e + u for e, u in zip(ends, upd))
        if t > best:
            best, where = t, "chains" if link is None else f"link {link}->{(link + 1) % p}"
    return best, where
