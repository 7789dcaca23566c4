"""The alternating schedules' chains (auto/alternating.py) are lower bounds: on random pipelines (stage times,
deferred weight passes, slow and fast links, latencies, H-1F1B warm-ups) neither exceeds the simulator's
end of compute, the last action of any stage, nor a stage's bound on its last backward the simulated end
of that backward (the event loop is the independent reference)."""
from __future__ import annotations

import random

import pytest

from heteropp.auto.alternating import last_backward_ends, round_trip_bound, stage_bound
from heteropp.auto.costs import CostModel
from heteropp.auto.simulator import StageTimes, simulate
from heteropp.schedules import build, kind


def _simulated_ends(stages: list[StageTimes], links: list[float], lat: list[float], m: int,
                    sched) -> tuple[float, list[float]]:
    """The end of compute, and per stage the end of its last backward (input gradient where deferred)."""
    res = simulate(stages, links, m, sched, keep_timeline=True, latency_s=lat)
    last = [max(end for s, a, *_, end in res.timeline if s == k and a in ("B", "I")) for k in range(len(stages))]
    return max(end for *_, end in res.timeline), last


@pytest.mark.parametrize("schedule", ["1f1b", "h1f1b", "zbh1"])
def test_chains_never_exceed_the_simulated_end_of_compute(schedule):
    rng = random.Random(11)
    sk, tight, tight_stage = kind(schedule), 0, 0
    for _ in range(150):
        p, m = rng.randint(2, 7), rng.randint(1, 24)
        stages = []
        for _ in range(p):
            f = rng.uniform(0.1, 3.0)
            b = f * rng.uniform(1.2, 3.5)
            stages.append(StageTimes(f, b, b * rng.uniform(0.2, 0.6), 0.0))
        links = [rng.choice([0.0, rng.uniform(0, 0.5), rng.uniform(1, 8)]) for _ in range(p - 1)]
        lat = [rng.choice([0.0, rng.uniform(0, 2)]) for _ in range(p - 1)]
        q = {"extra_warmup": [rng.randint(0, 3) for _ in range(p - 1)]} if schedule == "h1f1b" else {}
        defers = sk.defers_weight_grads
        fs = [s.fwd for s in stages]
        bs = [s.bwd - s.wgrad if defers else s.bwd for s in stages]
        ws = [s.wgrad if defers else 0.0 for s in stages]
        spans = [(sk.round_trip_span or sk.in_flight)(k, p, m, q) for k in range(p)]
        held = [sk.held_weight_passes(k, p, m, q) if sk.held_weight_passes else m for k in range(p)]
        end, last = _simulated_ends(stages, links, lat, m, build(schedule, p, m, q))
        for bound, _ in (stage_bound(fs, bs, ws, links, lat, spans, m, held),
                         round_trip_bound(fs, bs, ws, links, lat, spans, m, held)):
            assert bound <= end * (1 + 1e-9), (schedule, p, m, stages, links, lat, q, bound, end)
            tight += bound >= end * 0.97
        per_stage = last_backward_ends(fs, bs, ws, links, lat, spans, m, held,
                                       CostModel.pass_last_backward(fs, bs, links, lat, m, spans, ws, held))
        for k, (bound, got) in enumerate(zip(per_stage, last)):
            assert bound <= got * (1 + 1e-9), (schedule, k, p, m, stages, links, lat, q, bound, got)
            tight_stage += bound >= got * 0.97
    assert tight > 50  # the bounds are often within 3% of the simulated end, not vacuous
    assert tight_stage > 150
