"""Every plan the planner returns carries a time within 5% of what the simulator (the event loop, not the
cost model) measures for it: the best plan and each runner-up, under every schedule, on the small random
instances of bench/heteroauto_vs_brute.py (three chip types, 4 to 8 micro-batches, slow links), where the
search's objective, which leaves round trips and whole passes out, overprices plans by up to ~25%."""
from __future__ import annotations

import random

import pytest

from bench.heteroauto_vs_brute import random_problem
from heteropp.auto.plan_sim import simulate_plan, simulate_stages
from heteropp.auto.planning import best_params, run_search, to_plan
from heteropp.spec import InfeasibleError

SCHEDULES = ("gpipe", "1f1b", "zbh1", "h1f1b", "interleaved")
AGREE = 0.05  # the demand: estimate and simulation within 5% on every returned plan
INSTANCES = 30


def _off(seed: int, schedule: str) -> list[tuple[float, int, str]]:
    """(estimate / simulated - 1, instance, which plan) of every returned plan."""
    rng, out = random.Random(seed), []
    for i in range(INSTANCES):
        pb = random_problem(rng, schedule)
        try:
            res = run_search(pb, progress=None)
            plan = to_plan(pb, res.best, None, "auto")
        except InfeasibleError:
            continue
        sim = simulate_plan(pb.cm, plan).iteration_time_s
        out.append((plan.iteration_time_s / sim - 1, i, "plan's iteration_time_s"))
        out.append((res.best.time_s / sim - 1, i, "best"))
        for k, c in enumerate(res.runners_up):
            try:
                params, stages, _ = best_params(pb, c)
            except InfeasibleError:
                continue
            sim = simulate_stages(pb.cm, stages, c.dp, pb.train.schedule, params=params).iteration_time_s
            out.append((c.time_s / sim - 1, i, f"runner-up {k}"))
    return out


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_returned_plan_reports_a_time_within_5_percent_of_its_simulation(schedule, seed):
    off = _off(seed, schedule)
    assert off, "no instance had a plan"
    worst = max(off, key=lambda x: abs(x[0]))
    assert abs(worst[0]) <= AGREE, f"{100 * worst[0]:+.1f}% at instance {worst[1]} ({worst[2]})"


def test_ranking_the_kept_plans_by_their_full_estimate_finds_the_brute_force_optimum():
    """Seed 2's instance 1 under 1F1B (4 micro-batches): the objective ranks the brute force's best plan
    (over every dp, order, split, simulated) below plans it overprices less; ranked by the full estimate,
    the planner returns it. In the objective's order it returned a plan 7.4% slower (21.86 s)."""
    from heteropp.auto.brute_force import brute_force
    rng = random.Random(2)
    for _ in range(2):
        pb = random_problem(rng, "1f1b")
    plan = to_plan(pb, run_search(pb, progress=None).best, None, "auto")
    assert plan.iteration_time_s == pytest.approx(brute_force(pb)[0], rel=1e-9)
