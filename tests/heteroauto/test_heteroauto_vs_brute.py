"""The planner's plan against the brute force over (plan, schedule parameters), each simulated
(heteropp/auto/brute_force.py), on located instances of bench/heteroauto_vs_brute.py where the planner
returned a slower plan before. The search prunes and splits by its objective, which leaves round trips out
and so overprices short pipelines at few micro-batches; each case is one way a faster plan was missed."""
from __future__ import annotations

import random

import pytest

from bench.heteroauto_vs_brute import random_problem
from heteropp.auto.brute_force import brute_force
from heteropp.auto.planning import run_search, to_plan


def _instance(schedule: str, seed: int, index: int):
    rng = random.Random(seed)
    for _ in range(index + 1):
        pb = random_problem(rng, schedule)
    return pb


@pytest.mark.parametrize("schedule,seed,index,before", [
    # another split of the search's own stages: its objective ties ([Z1 Z1 X1 Y3 Y1] and [.. Y2 Y2] both
    # 32.04 s), the simulator does not (30.54 s against 29.04 s); a layer move finds it
    ("1f1b", 5, 22, 0.052),
    # a split two stages apart: [Y2 Y2 X1 Z1 Z1] from the search's [Y1 Y2 X1 Z2 Z1], one layer moved
    # across two boundaries (single moves across one boundary only made it slower first)
    ("1f1b", 5, 24, 0.042),
    # another order, whose best split by the objective the simulator ranks fifth, 4.5% above the best:
    # it was outside the re-rank's error margin, so no local search started from it
    ("1f1b", 5, 4, 0.021),
    # another order, priced 15% above its simulated time by the objective (its 4 micro-batches' warm-up
    # overlaps the round trip the objective charges in full), so not the search's; a collected plan
    # reaches it by a layer moved across two boundaries
    ("1f1b", 5, 20, 0.085),
    # H-1F1B: the same plan with the warm-up [0, 1, 0], reached the same way
    ("h1f1b", 5, 20, 0.067),
    # H-1F1B: [Y3 X1 X1 Z1] with warm-up [1, 0, 0]; the usual options and single steps give it [0, 0, 1]
    # (30.08 s), whose single steps up exceed memory and are cut back to it: one step moved from one
    # boundary to another reaches it (29.08 s)
    ("h1f1b", 2, 8, 0.034),
    # ZB-H1: [Y2r X2 Z1 Z1], a layer moved from the recomputing Z stage of a collected plan to the Y stage,
    # which must then recompute; the move kept Z recomputing because it checked Z's memory on the whole
    # plan, Y's over-full stage included
    ("zbh1", 5, 20, 0.015),
])
def test_planner_finds_the_brute_force_optimum_on_an_instance_it_missed(schedule, seed, index, before):
    """The planner's plan simulates no slower than the brute force's best (it also has TP and inner
    replicas, so it may be faster); `before`: how much slower it was."""
    pb = _instance(schedule, seed, index)
    plan = to_plan(pb, run_search(pb, progress=None).best, None, "auto")
    best = brute_force(pb)[0]
    assert plan.iteration_time_s <= best * (1 + 1e-9), f"{100 * (plan.iteration_time_s / best - 1):.1f}% slower"
