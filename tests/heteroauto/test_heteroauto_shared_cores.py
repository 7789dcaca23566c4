"""The processor-sharing simulation (plans whose chips are processes on one host's cores): with enough
cores it reproduces the event simulator exactly; with fewer it matches hand-computed schedules."""
from __future__ import annotations

import math
import random

import pytest

from heteropp.auto.shared_cores import simulate_shared_cores
from heteropp.auto.simulator import StageTimes, simulate


def _random_stages(rng: random.Random, p: int) -> tuple[list[StageTimes], list[float]]:
    st = []
    for _ in range(p):
        bwd = rng.uniform(0.5, 3.0)
        st.append(StageTimes(fwd=rng.uniform(0.2, 2.0), bwd=bwd, wgrad=rng.uniform(0.0, bwd), update=rng.uniform(0, 1)))
    return st, [rng.uniform(0.0, 0.5) for _ in range(p - 1)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zbh1"])
@pytest.mark.parametrize("seed", range(8))
def test_enough_cores_equals_the_event_simulator(schedule: str, seed: int) -> None:
    rng = random.Random(seed)
    p, m = rng.randint(1, 5), rng.randint(1, 9)
    st, es = _random_stages(rng, p)
    ranks = [rng.choice([1, 2, 4]) for _ in range(p)]
    want = simulate(st, es, m, schedule).iteration_time_s
    for cores in (math.inf, float(sum(ranks))):
        assert simulate_shared_cores(st, es, m, schedule, ranks, cores) == pytest.approx(want, rel=1e-9)


def test_one_stage_on_half_the_cores_takes_twice_as_long() -> None:
    st = [StageTimes(fwd=1.0, bwd=2.0, wgrad=0.5, update=0.25)]
    # 3 micro-batches of 3 s each plus the update, all at half speed (2 ranks on 1 core)
    assert simulate_shared_cores(st, [], 3, "1f1b", [2], 1.0) == pytest.approx(2 * (3 * 3.0 + 0.25))


def test_two_stages_on_one_core_hand_computed() -> None:
    """GPipe, 2 stages x 1 rank, 1 core, one micro-batch, no transfer time: the stages never overlap (each
    waits on the other), so the step is the plain sum; with 2 micro-batches stage 0's second forward
    overlaps stage 1's first and both run at half speed while they do."""
    st = [StageTimes(fwd=1.0, bwd=1.0, wgrad=0.0, update=0.0)] * 2
    assert simulate_shared_cores(st, [0.0], 1, "gpipe", [1, 1], 1.0) == pytest.approx(4.0)
    # F0(0) 0-1; then F0(1) and F1(0) share the core: both end at 3; F1(1) alone 3-4; then B1(0) 4-5,
    # B1(1) and B0(0) share: 5-7; B0(1) alone 7-8. On 2 cores: 0-1, 1-2, 2-3, 3-4, 4-5, 5-6 = 6.
    assert simulate_shared_cores(st, [0.0], 2, "gpipe", [1, 1], 1.0) == pytest.approx(8.0)
    assert simulate_shared_cores(st, [0.0], 2, "gpipe", [1, 1], 2.0) == pytest.approx(6.0)


def test_bad_arguments_are_named() -> None:
    st = [StageTimes(fwd=1.0, bwd=1.0, wgrad=0.0, update=0.0)]
    with pytest.raises(ValueError, match="ranks"):
        simulate_shared_cores(st, [], 1, "1f1b", [0], 1.0)
    with pytest.raises(ValueError, match="cores"):
        simulate_shared_cores(st, [], 1, "1f1b", [1], 0.0)
    with pytest.raises(ValueError, match="slowdown"):
        simulate_shared_cores(st, [], 1, "1f1b", [1], 1.0, slowdown=[1.0, 0.0])
    with pytest.raises(ValueError, match="tp"):
        simulate_shared_cores(st, [], 1, "1f1b", [1], 1.0, tp=[1, 1])


@pytest.mark.parametrize("seed", range(6))
def test_a_fair_slowdown_table_equals_fair_sharing(seed: int) -> None:
    rng = random.Random(100 + seed)
    p, m, cores = rng.randint(1, 4), rng.randint(1, 6), rng.choice([1.0, 2.0, 3.0])
    st, es = _random_stages(rng, p)
    ranks = [rng.choice([1, 2]) for _ in range(p)]
    fair = [max(1.0, k / cores) for k in range(1, sum(ranks) + 1)]
    for schedule in ("gpipe", "1f1b", "zbh1"):
        want = simulate_shared_cores(st, es, m, schedule, ranks, cores)
        assert simulate_shared_cores(st, es, m, schedule, ranks, cores, slowdown=fair) == pytest.approx(want, rel=1e-9)


def test_measured_slowdown_hand_computed() -> None:
    """As test_two_stages_on_one_core_hand_computed, but two ranks computing at once each take 1.6x as long
    (a host that loses throughput to the sharing): F0(0) 0-1; F0(1) and F1(0) 1-2.6; F1(1) 2.6-3.6;
    B1(0) 3.6-4.6; B1(1) and B0(0) 4.6-6.2; B0(1) 6.2-7.2."""
    st = [StageTimes(fwd=1.0, bwd=1.0, wgrad=0.0, update=0.0)] * 2
    assert simulate_shared_cores(st, [0.0], 2, "gpipe", [1, 1], 2.0, slowdown=[1.0, 1.6]) == pytest.approx(7.2)


def test_stage_timed_with_its_own_ranks_is_not_slowed_by_them() -> None:
    st = [StageTimes(fwd=1.0, bwd=2.0, wgrad=0.5, update=0.25)]
    alone = 3 * 3.0 + 0.25
    # a TP-2 stage profiled with its pair running: alone it runs at its profiled speed
    assert simulate_shared_cores(st, [], 3, "1f1b", [2], 2.0, slowdown=[1.0, 1.2, 1.5], tp=[2]) == pytest.approx(alone)
    # the same stage's entries timed by one rank: its two ranks at once take 1.2x as long
    assert simulate_shared_cores(st, [], 3, "1f1b", [2], 2.0, slowdown=[1.0, 1.2, 1.5]) == pytest.approx(1.2 * alone)
    # beyond the table the last factor grows with the ranks: 4 ranks -> 1.0 * 4 / 2
    assert simulate_shared_cores(st, [], 3, "1f1b", [4], 2.0, slowdown=[1.0, 1.0]) == pytest.approx(2 * alone)
