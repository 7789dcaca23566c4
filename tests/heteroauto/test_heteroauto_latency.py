"""Link latency: parsed with units, priced by the cost model as fill and drain only (messages pipeline),
and by the simulator as time on top of a transfer that does not occupy the link."""
from __future__ import annotations

import random

import pytest

from heteropp.auto.makespan import makespan
from heteropp.auto.simulator import StageTimes, simulate
from heteropp.spec import SpecError, cluster_from_dict

from heteroauto_helpers import chip, make_problem


def test_latency_units_and_errors():
    cl = cluster_from_dict({"chips": [chip("X", 2, 9.0), {**chip("Y", 2, 9.0), "network_latency": "50us"}],
                            "links": [{"between": ["X", "Y"], "bandwidth": 1, "latency": "2ms"}]}, "t")
    assert cl.latency_s("Y", "X") == pytest.approx(2e-3) and cl.latency_s("Y", "Y") == pytest.approx(50e-6)
    with pytest.raises(SpecError, match=r"links\[0\]\.latency.*'1ms'"):
        cluster_from_dict({"chips": [chip("X", 2, 9.0), chip("Y", 2, 9.0)],
                           "links": [{"between": ["X", "Y"], "bandwidth": 1, "latency": "soon"}]}, "t")


def test_one_micro_batch_pays_every_latency_twice():
    """m = 1: the iteration is the sum of every stage's F + B, each boundary's transfer and latency once
    each way, then the slowest tail of updates (zero here)."""
    rng = random.Random(1)
    for _ in range(20):
        p = rng.randint(1, 5)
        st = [StageTimes(rng.uniform(0.5, 2), rng.uniform(1, 3), 0.5, 0.0) for _ in range(p)]
        e = [rng.uniform(0, 1) for _ in range(p - 1)]
        lat = [rng.uniform(0, 2) for _ in range(p - 1)]
        want = sum(s.fwd + s.bwd for s in st) + 2 * sum(e) + 2 * sum(lat)
        for sched in ("1f1b", "gpipe"):  # (ZB-H1 defers weight passes off the chain)
            assert simulate(st, e, 1, sched, latency_s=lat).iteration_time_s == pytest.approx(want)
            assert makespan(st, e, 1, sched, lat) == pytest.approx(want)


def test_latency_does_not_occupy_the_link():
    """Many micro-batches over a high-latency, fast link: latency adds only fill and drain (2 x latency),
    so the simulator's time grows by exactly that, while a link busy for the same time per transfer would
    serialise every micro-batch behind it."""
    st = [StageTimes(1.0, 2.0, 1.0, 0.0)] * 2
    m = 12
    base = simulate(st, [0.0], m, "gpipe").iteration_time_s
    with_lat = simulate(st, [0.0], m, "gpipe", latency_s=[5.0]).iteration_time_s
    assert with_lat == pytest.approx(base + 10.0)
    assert simulate(st, [5.0], m, "gpipe").iteration_time_s > base + 5.0 * (m - 1)


def test_cost_model_adds_latency_to_fill_only():
    plain = make_problem([chip("X", 2, 14.0), chip("Y", 2, 14.0)], {"X": 1.0, "Y": 1.0}, layers=4, gb=8,
                         links=[{"between": ["X", "Y"], "bandwidth": 1}])
    slow = make_problem([chip("X", 2, 14.0), chip("Y", 2, 14.0)], {"X": 1.0, "Y": 1.0}, layers=4, gb=8,
                        links=[{"between": ["X", "Y"], "bandwidth": 1, "latency": 0.25}])
    from heteropp.auto.costs import StageSpec
    stages = [StageSpec("X", 1, 2, False), StageSpec("X", 1, 1, False), StageSpec("Y", 1, 1, False)]
    a, b = plain.evaluate(stages, 2, 4), slow.evaluate(stages, 2, 4)
    assert b.fill_drain_s == pytest.approx(a.fill_drain_s + 2 * 0.25)
    assert b.iteration_time_s >= a.iteration_time_s + 2 * 0.25 - 1e-12


def test_dp_gradient_sync_inside_a_node_runs_at_the_node_bandwidth():
    """By hand: a ring all-reduce of n bytes over d ranks moves 2 (d - 1) / d n bytes per rank, a ring
    all-gather (d - 1) / d n (the engine's ZeRO-1 step: fp32 gradients, then bf16 weights); a stage of
    tp * dp chips within one node (chips_per_node 2 here) uses intra_node_bw (100 GB/s), else network_bw."""
    cm = make_problem([chip("X", 8, 40.0, tp_max=2, net=10.0)], {"X": 1.0}, layers=4, gb=8)
    params = 5e8
    moved = 2 * 1 / 2 * 4 * params + 1 / 2 * 2 * params
    assert cm._grad_sync("X", params, 2, 1) == pytest.approx(moved / 100e9)  # 2 chips: one node
    assert cm._grad_sync("X", params, 2, 2) == pytest.approx(moved / 10e9)  # 4 chips: two nodes
