"""The unrolled recurrence (makespan.py) against the event-driven simulator on random pipelines."""
from __future__ import annotations

import random

import pytest

from heteropp.auto.makespan import makespan, program
from heteropp.auto.simulator import StageTimes, simulate
from heteropp.schedules import build


def _random_pipeline(rng: random.Random, p: int) -> tuple[list[StageTimes], list[float]]:
    stages = []
    for _ in range(p):
        f = rng.uniform(0.1, 3.0)
        b = f * rng.uniform(1.2, 3.5)
        stages.append(StageTimes(f, b, b * rng.uniform(0.2, 0.6), rng.choice([0.0, rng.uniform(0, 20)])))
    links = [rng.choice([0.0, rng.uniform(0, 0.5), rng.uniform(1, 6)]) for _ in range(p - 1)]
    return stages, links


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zbh1"])
def test_makespan_equals_simulator(schedule):
    rng = random.Random(7)
    for _ in range(150):
        p, m = rng.randint(1, 9), rng.randint(1, 24)
        stages, links = _random_pipeline(rng, p)
        want = simulate(stages, links, m, schedule).iteration_time_s
        assert makespan(stages, links, m, schedule) == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_makespan_equals_simulator_with_schedule_parameters():
    """H-1F1B with random extra warm-ups, and interleaved 1F1B with one chunk: the recurrence the re-rank
    times every parameter option with (planning.best_params) against the event loop on the built lists."""
    rng = random.Random(8)
    for _ in range(80):
        p, m = rng.randint(1, 7), rng.randint(1, 20)
        stages, links = _random_pipeline(rng, p)
        q = {"extra_warmup": [rng.randint(0, 4) for _ in range(p - 1)]}
        lat = [rng.choice([0.0, rng.uniform(0, 2)]) for _ in range(p - 1)]
        want = simulate(stages, links, m, build("h1f1b", p, m, q), latency_s=lat).iteration_time_s
        assert makespan(stages, links, m, "h1f1b", lat, q) == pytest.approx(want, rel=1e-12, abs=1e-12)
        m = max(m // p, 1) * p
        want = simulate(stages, links, m, build("interleaved", p, m, {"chunks": 1})).iteration_time_s
        assert makespan(stages, links, m, "interleaved", None, {"chunks": 1}) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("chunks", [2, 3])
def test_makespan_equals_simulator_on_virtual_stages(chunks):
    """Interleaved 1F1B with several chunks (one time per virtual stage, the wrap-around link from the
    last stage to the first included): the recurrence the re-rank times every chunk option with."""
    rng = random.Random(9 + chunks)
    for _ in range(60):
        p = rng.randint(1, 5)
        m = p * rng.randint(1, 5)
        stages, links = _random_pipeline(rng, p * chunks)
        lat = [rng.choice([0.0, rng.uniform(0, 2)]) for _ in links]
        q = {"chunks": chunks}
        want = simulate(stages, links, m, build("interleaved", p, m, q), latency_s=lat).iteration_time_s
        assert makespan(stages, links, m, "interleaved", lat, q) == pytest.approx(want, rel=1e-12)


def test_program_is_every_compute_action_once():
    prog = program("zbh1", 4, 6)
    assert len(prog) == 4 * 6 * 3 and len(set(prog)) == len(prog)


def test_slow_link_paces_makespan():
    """Two equal stages, a link slower than both: m transfers back to back, plus one stage's F and B."""
    st = [StageTimes(1.0, 2.0, 1.0, 0.0)] * 2
    assert makespan(st, [10.0], 6, "1f1b") == pytest.approx(simulate(st, [10.0], 6, "1f1b").iteration_time_s)
    assert makespan(st, [10.0], 6, "1f1b") >= 6 * 10.0
