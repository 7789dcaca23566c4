"""Search correctness against the exact reference search over the whole space (small synthetic clusters)."""
from __future__ import annotations

import pytest

from heteropp.auto.costs import micro_batches
from heteropp.auto.h2 import search_h2
from heteropp.auto.reference import reference_search
from heteropp.auto.search import search_auto
from heteropp.auto.space import dp_candidates
from heteropp.spec import InfeasibleError

from heteroauto_helpers import chip, make_problem


CASES = {
    "two types, memory binds": dict(
        chips=[chip("X", 4, 14.0), chip("Y", 4, 7.0)], speeds={"X": 1.0, "Y": 0.5}, layers=8, gb=8
    ),
    "three types": dict(
        chips=[chip("X", 2, 14.0), chip("Y", 2, 9.0), chip("Z", 2, 20.0, tp_max=1)],
        speeds={"X": 1.0, "Y": 0.6, "Z": 1.5},
        layers=7,
        gb=4,
    ),
    "slow cross link": dict(
        chips=[chip("X", 4, 14.0), chip("Y", 4, 9.0)],
        speeds={"X": 1.0, "Y": 0.7},
        layers=8,
        gb=8,
        links=[{"between": ["X", "Y"], "bandwidth": 0.0005}],
    ),
    "link latency": dict(
        chips=[chip("X", 4, 14.0), chip("Y", 4, 9.0)],
        speeds={"X": 1.0, "Y": 0.7},
        layers=8,
        gb=8,
        links=[{"between": ["X", "Y"], "bandwidth": 0.05, "latency": "0.4s"}],
    ),
    "zbh1": dict(
        chips=[chip("X", 4, 14.0), chip("Y", 4, 7.0)], speeds={"X": 1.0, "Y": 0.5}, layers=8, gb=8, schedule="zbh1"
    ),
    "gpipe": dict(
        chips=[chip("X", 2, 30.0), chip("Y", 2, 20.0)], speeds={"X": 1.0, "Y": 0.5}, layers=6, gb=4, schedule="gpipe"
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_auto_equals_brute_force_optimum(name):
    """The auto search finds exactly the brute-force optimum of the cost model (group size 2 so that
    TP may differ between the two groups of one type)."""
    cm = make_problem(**CASES[name])
    want = reference_search(cm, group_size=2)
    got = search_auto(cm, group_size=2, rerank=False)
    assert got.best.time_s == pytest.approx(want, rel=1e-9)
    b = micro_batches(cm.train, got.best.dp)
    e = cm.evaluate(got.best.stages, got.best.dp, b)
    assert e.feasible and e.iteration_time_s == pytest.approx(got.best.time_s, rel=1e-9)


@pytest.mark.parametrize("name", list(CASES))
def test_auto_never_worse_than_h2(name):
    cm = make_problem(**CASES[name])
    h2 = search_h2(cm, group_size=2)
    auto = search_auto(cm, group_size=2, rerank=False)
    b = micro_batches(cm.train, h2.best.dp)
    assert cm.evaluate(h2.best.stages, h2.best.dp, b).feasible, "h2's plan must fit the full memory model"
    assert auto.best.time_s <= h2.best.time_s * (1 + 1e-12)


def test_h2_hand_worked_example():
    """Two types of 2 chips, tp_max 1, 6 layers, global batch 4, no memory pressure. Per layer:
    X tau = 3 s (f=1, b=2), Y tau = 1.5 s; optimizer 0.01 s / dp; the engine's ZeRO-1 step at dp=2 sends
    the fp32 gradients, 2*(1/2) * 4 B * 1e8 params / 10 GB/s = 0.04 s, and the bf16 weights,
    (1/2) * 2 B * 1e8 / 10 GB/s = 0.01 s.
    dp=1 (b=4, s_pp 2+2): equal compute l_X = 6*(2/3)/(2/3+2/1.5) = 2, l_Y = 4, one and two layers per
      stage, T_X = T_Y = 3; cost max(4*3+0.01+9, 4*3+0.02+9) = 21.02.
    dp=2 (b=2, s_pp 1+1): l_X = 6*(1/3)/(1/3+1/1.5) = 2, l_Y = 4, T_X = T_Y = 6, update 0.055 s per layer;
      cost max(2*6+0.11+6, 2*6+0.22+6) = 18.22 -> chosen."""
    cm = make_problem([chip("X", 2, 40.0, tp_max=1), chip("Y", 2, 30.0, tp_max=1)], {"X": 1.0, "Y": 0.5},
                      layers=6, gb=4)
    r = search_h2(cm, two_stage=False)
    assert r.best.dp == 2
    assert [(s.chip, s.tp, s.layers, s.recompute) for s in r.best.stages] == [("X", 1, 2, False), ("Y", 1, 4, False)]
    assert r.best.label == "h2 cost 18.2200 s"


def test_h2_orders_types_by_memory():
    """The paper maps larger-memory chips to earlier stages, whatever order the cluster file lists them."""
    cm = make_problem([chip("Y", 2, 30.0, tp_max=1), chip("X", 2, 40.0, tp_max=1)], {"X": 1.0, "Y": 0.5},
                      layers=6, gb=4)
    assert [s.chip for s in search_h2(cm, two_stage=False).best.stages] == ["X", "Y"]


def test_impossible_inputs_say_why():
    cm = make_problem([chip("X", 2, 0.3), chip("Y", 2, 0.3)], {"X": 1.0, "Y": 1.0}, layers=8, gb=4)
    with pytest.raises(InfeasibleError, match="no plan fits"):
        search_auto(cm)
    with pytest.raises(InfeasibleError, match="no plan fits"):
        search_h2(cm)
    cm = make_problem(
        [chip("X", 8, 40.0, tp_max=1), chip("Y", 8, 40.0, tp_max=1)], {"X": 1.0, "Y": 1.0}, layers=3, gb=1
    )
    with pytest.raises(InfeasibleError, match="no plan fits"):  # dp=1, tp=1: 16 stages for 3 layers
        search_auto(cm, idle="never")


def test_an_unknown_idle_mode_is_an_error():
    """A misspelt `idle` would otherwise run the search as none of the three modes without a word."""
    cm = make_problem(**CASES["two types, memory binds"])
    with pytest.raises(ValueError, match="idle='sometimes'.*auto, never, always"):
        search_auto(cm, idle="sometimes")


def test_integral_level_is_least_level_where_whole_layers_fit():
    """Against a scan over every candidate level (multiples of each run's per-layer cost)."""
    import numpy as np
    from heteropp.auto.bounds import integral_level
    rng = np.random.default_rng(0)
    a = rng.uniform(0.5, 3.0, (50, 3))
    s = rng.integers(1, 4, (50, 3)).astype(float)
    cap = rng.integers(2, 12, (50, 3)).astype(float)
    L = 12
    got = integral_level(a, s, cap, np.zeros(50), L, steps=1000)
    for r in range(50):
        def held(z: float, r: int = r) -> float:
            return sum(min(s[r, k] * np.floor(z / a[r, k] + 1e-9), cap[r, k]) for k in range(3))
        levels = sorted(a[r, k] * n for k in range(3) for n in range(1, 40))
        want = next((z for z in levels if held(z) >= L), np.inf)
        assert got[r] == pytest.approx(want)


def test_dp_candidates_are_the_common_divisors_also_for_huge_counts():
    """Against a loop over every size on small counts; for millions of chips (the most of one type a
    cluster file takes is 2^24) against the divisors of gcd = 2^11 * 3^6 written out."""
    import random
    from dataclasses import replace
    rng = random.Random(5)
    for _ in range(50):
        counts = [rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 36, 48, 96]) for _ in range(rng.randint(1, 3))]
        gb = rng.choice([1, 6, 8, 24, 64, 96])
        cm = make_problem([chip(f"T{i}", n, 40.0) for i, n in enumerate(counts)],
                          {f"T{i}": 1.0 for i in range(len(counts))}, layers=8, gb=gb)
        want = [d for d in range(1, min(counts) + 1) if gb % d == 0 and all(n % d == 0 for n in counts)]
        assert dp_candidates(cm.cluster, cm.train) == want
    cm = make_problem([chip("X", 2**12 * 3**6, 40.0), chip("Y", 2**11 * 3**7, 40.0)], {"X": 1.0, "Y": 1.0},
                      layers=8, gb=8)
    want = sorted(2**a * 3**b for a in range(12) for b in range(7))
    assert dp_candidates(cm.cluster, replace(cm.train, global_batch=6**12)) == want
