"""Interleaved 1F1B's estimate (auto/chains.py) is a longest chain of the actions the simulator runs, with
the queues of one link at a time: on random pipelines of virtual stages (unequal chunks, slow and fast links,
the wrap-around link from the last stage to the first included, latencies) it never exceeds the event-loop
simulator's iteration time, and it equals it where at most one link can queue (the independent reference is
simulator.simulate)."""
from __future__ import annotations

import random

import pytest

from heteropp.auto.chains import chain_bound, queueing_links
from heteropp.auto.makespan import compute_ends
from heteropp.auto.simulator import StageTimes, simulate
from heteropp.schedules import build


def _random_virtual_pipeline(rng: random.Random, p: int, v: int) -> tuple[list[StageTimes], list[float], list[float]]:
    """Per virtual stage u = c p + s: chunk c of stage s (its own share of the stage's passes); per link s
    (stage s to s + 1, the last one back to stage 0) one transfer time and latency, used by every chunk."""
    stages = []
    for _ in range(p * v):
        f = rng.uniform(0.1, 3.0)
        b = f * rng.uniform(1.2, 3.5)
        stages.append(StageTimes(f, b, 0.0, rng.choice([0.0, rng.uniform(0, 10)])))
    link = [rng.choice([0.0, rng.uniform(0, 0.5), rng.uniform(1, 8)]) for _ in range(p)]
    lat = [rng.choice([0.0, rng.uniform(0, 2)]) for _ in range(p)]
    return stages, [link[u % p] for u in range(p * v - 1)], [lat[u % p] for u in range(p * v - 1)]


@pytest.mark.parametrize("chunks", [1, 2, 3])
def test_chain_bound_never_exceeds_the_simulator_and_is_exact_with_one_queueing_link(chunks):
    rng = random.Random(20 + chunks)
    v, exact, several = chunks, 0, 0
    for _ in range(120):
        p = rng.randint(1, 6)
        m = p * rng.randint(1, 6)
        stages, links, lat = _random_virtual_pipeline(rng, p, v)
        q = {"chunks": v}
        sim = simulate(stages, links, m, build("interleaved", p, m, q), latency_s=lat).iteration_time_s
        bound, _ = chain_bound(stages, links, m, "interleaved", lat, q)
        assert bound <= sim * (1 + 1e-12), (p, m, stages, links, lat, bound, sim)
        if len(queueing_links(stages, links, p)) <= 1:
            assert bound == pytest.approx(sim, rel=1e-12), (p, m, stages, links, lat, bound, sim)
            exact += 1
        else:
            several += 1
    assert exact > 20 and several > 20  # both kinds of pipeline occur


def test_a_link_whose_transfers_fit_between_its_senders_actions_never_queues():
    """Relaxing the queues of the links queueing_links leaves out changes no stage's end."""
    rng = random.Random(31)
    for _ in range(80):
        p, v = rng.randint(2, 5), rng.randint(1, 3)
        m = p * rng.randint(1, 4)
        stages, links, lat = _random_virtual_pipeline(rng, p, v)
        q = {"chunks": v}
        keep = queueing_links(stages, links, p)
        want = simulate(stages, links, m, build("interleaved", p, m, q), latency_s=lat).iteration_time_s
        ends = compute_ends(stages, links, m, "interleaved", lat, q, queued=keep)
        got = max(e + sum(stages[c * p + s].update for c in range(v)) for s, e in enumerate(ends))
        assert got == pytest.approx(want, rel=1e-12), (p, v, m, keep)


def test_one_slow_link_queues_and_the_relaxed_chains_alone_miss_it():
    """Two stages of two chunks behind a link eight times slower than their backward: its channels queue
    (the chains without queues are far below the simulator), the bound names that link."""
    p, v, m = 2, 2, 8
    stages = [StageTimes(0.25, 0.5, 0.0, 0.0)] * (p * v)
    links = [4.0, 0.0, 4.0]  # link 0 (stage 0 -> 1) slow, the wrap-around link fast
    sim = simulate(stages, links, m, build("interleaved", p, m, {"chunks": v})).iteration_time_s
    free = compute_ends(stages, links, m, "interleaved", None, {"chunks": v}, queued=())
    bound, where = chain_bound(stages, links, m, "interleaved", None, {"chunks": v})
    assert max(free) < 0.8 * sim and bound == pytest.approx(sim) and where == "link 0->1"
    assert sim >= v * m * 4.0  # the forward channel of link 0 carries every chunk of every micro-batch
