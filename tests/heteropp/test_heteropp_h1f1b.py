"""H-1F1B (extra warm-up forwards in front of slow boundaries) from the one schedule registry: action lists
that validate for any extras, the in-flight activations the registry charges equal to what the simulator
sees, the engine training to the single-process reference under it, and a plan that needs its parameters
rejected without them."""
from __future__ import annotations

import random

import pytest

from heteropp.auto.simulator import StageTimes, simulate
from heteropp.engine import launch
from heteropp.plan import Plan, StagePlan
from heteropp.schedules import ScheduleError, build, h1f1b_extra, kind, validate, with_comms
from tests.heteropp.heteropp_helpers import (MODEL, RTOL, check_losses, config, full_grads, losses, ref_grads,
                                             reference, rel)


def test_h1f1b_validates_and_holds_the_warmup_plus_one():
    """Random stage counts, micro-batches and extras: deadlock-free, stage s's warm-up is
    sum_{j>=s} (1 + extra_j) (capped at m), and the simulator's peak activations per stage equal the
    registry's in-flight count."""
    rng = random.Random(0)
    for _ in range(40):
        p, m = rng.randint(1, 5), rng.randint(1, 9)
        extra = [rng.randint(0, 3) for _ in range(p - 1)]
        sched = build("h1f1b", p, m, {"extra_warmup": extra})
        validate(with_comms(sched), m)
        for s, acts in enumerate(sched):
            warm = 0
            while warm < len(acts) and acts[warm].op == "F":
                warm += 1
            # the warm-up forwards, then the steady state's first F (every F when the warm-up covers all)
            assert warm == min(sum(1 + x for x in extra[s:]) + 1, m), (p, m, extra, s, warm)
        st = [StageTimes(1.0, 2.0, 1.0, 0.0, static_bytes=0.0, act_bytes=1.0, transient_bytes=0.0)] * p
        peaks = simulate(st, [0.5] * (p - 1), m, sched).peak_memory_bytes
        assert peaks == [kind("h1f1b").in_flight(s, p, m, {"extra_warmup": extra}) for s in range(p)]


def test_h1f1b_hides_a_slow_link_that_1f1b_cannot():
    """Two equal stages (F 1, B 2), a link taking 2 each way (below a stage's compute, so the link is no
    bottleneck): 1F1B's single micro-batch in flight waits the round trip every cycle; HARP's extra warm-up
    (ceil(2 * 2 / 3) = 2 more in flight) keeps both stages busy, and the iteration is the closed form
    m (F + B) of the busy stage plus one micro-batch's F + B and one round trip (2 e) of fill and drain."""
    st = [StageTimes(1.0, 2.0, 1.0, 0.0)] * 2
    e, m = [2.0], 16
    extra = h1f1b_extra([3.0, 3.0], e)
    assert extra == [2]
    one = simulate(st, e, m, "1f1b").iteration_time_s
    h = simulate(st, e, m, build("h1f1b", 2, m, {"extra_warmup": extra})).iteration_time_s
    assert h == pytest.approx(m * 3.0 + 3.0 + 2 * 2.0, rel=1e-12)
    assert one > 1.4 * h


PLAN = Plan([StagePlan("A", 1, 2), StagePlan("B", 2, 2)], dp=1, micro_batch_size=1, micro_batches=4,
            num_layers=MODEL.layers, schedule="h1f1b", schedule_params={"extra_warmup": [2]})


def test_engine_trains_h1f1b_to_the_reference():
    res, want = launch(config(PLAN, ("h1f1b",))), reference(PLAN.global_batch)
    check_losses(losses(res, "h1f1b"), want["losses"], "h1f1b")
    got, want_grads = full_grads(res, "h1f1b"), ref_grads(want)
    assert max(rel(got[n], want_grads[n]) for n in want_grads) < RTOL


def test_h1f1b_without_its_parameters_is_rejected():
    from heteropp.engine.schedule import compile_schedule
    bare = Plan([StagePlan("A", 1, 2), StagePlan("B", 2, 2)], dp=1, micro_batch_size=1, micro_batches=4)
    with pytest.raises(ScheduleError, match="needs schedule_params.extra_warmup"):
        compile_schedule(bare, "h1f1b")
    from heteropp.spec import SpecError
    d = PLAN.to_dict()
    d["schedule_params"] = {"extra_warmup": [1, 2]}
    with pytest.raises(SpecError, match="extra_warmup must list 1 integers"):
        Plan.from_dict(d)
