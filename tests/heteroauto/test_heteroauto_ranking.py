"""The one ranking step (heteropp/auto/ranking.py): every candidate in one pool, ranked by a lower bound of
its simulated time, priced by the simulator in that order within one budget of simulated actions."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from bench.heteroauto_search import EXPERIMENTS, cm_problem, problem
from bench.heteroauto_vs_brute import random_problem
from heteropp.auto.candidates import Candidate
from heteropp.auto.costs import micro_batches
from heteropp.auto.plan_sim import simulate_stages
from heteropp.auto.planning import best_params, run_search, to_plan
from heteropp.auto.ranking import floor, forward_share
from heteropp.auto.search import search_auto
from heteropp.spec import InfeasibleError

SCHEDULES = ("gpipe", "1f1b", "zbh1", "h1f1b", "interleaved")


def _event_loop_s(pb, c: Candidate) -> float:
    """The plan's time by the event-loop simulator (not the recurrence the ranking prices with), with the
    schedule's best parameters."""
    params, stages, _ = best_params(pb, c)
    return simulate_stages(pb.cm, stages, c.dp, pb.train.schedule, params=params).iteration_time_s


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_the_floor_is_below_every_kept_plans_simulated_time(schedule):
    """The cheap objective the pool is ranked by never exceeds the event loop's time: a plan the ranking
    skips because its floor reaches the fastest time cannot run faster. Every plan the search keeps (its
    margin's too) on 12 random slow-link instances."""
    rng, checked = random.Random(7), 0
    for _ in range(12):
        pb = random_problem(rng, schedule)
        try:
            res = search_auto(pb.cm, 2, 24, margin=0.25, unranked=True, progress=None)
        except InfeasibleError:
            continue
        share = forward_share(pb)
        for c in [res.best, *res.runners_up]:
            try:
                sim = _event_loop_s(pb, c)
            except InfeasibleError:
                continue
            assert floor(pb, c, share) <= sim * (1 + 1e-9), (schedule, c.label)
            checked += 1
    assert checked >= 15


def test_the_returned_plan_is_no_slower_than_any_plan_returned_beside_it():
    """H2's Exp-A-1 and Exp-A-2: every runner-up, timed by the event loop, is no faster than the returned
    plan: the pool is ranked by simulation, not by the cost model's estimate."""
    for exp in ("Exp-A-1", "Exp-A-2"):
        pb = cm_problem(problem(*EXPERIMENTS[exp], None))
        res = run_search(pb)
        got = to_plan(pb, res.best, None, "auto").iteration_time_s
        assert res.runners_up, exp
        for c in res.runners_up:
            assert got <= _event_loop_s(pb, c) * (1 + 1e-9), (exp, c.label, got)


def test_the_returned_plan_is_no_slower_than_any_single_layer_move():
    """Small random slow-link instances under 1F1B, where the ranking runs its local search: the plan is a
    local optimum of the simulator (every layer moved from one stage to another, recompute flags kept,
    where memory holds it, timed by the event loop). The search's split is the best under its objective,
    not under the simulator."""
    rng, moves = random.Random(5), 0
    for _ in range(6):
        pb = random_problem(rng, "1f1b")
        try:
            best = run_search(pb, progress=None).best
        except InfeasibleError:
            continue
        got = to_plan(pb, best, None, "auto").iteration_time_s
        b = micro_batches(pb.train, best.dp)
        for src in range(len(best.stages)):
            for dst in range(len(best.stages)):
                if src == dst or best.stages[src].layers <= 1:
                    continue
                st = list(best.stages)
                st[src] = replace(st[src], layers=st[src].layers - 1)
                st[dst] = replace(st[dst], layers=st[dst].layers + 1)
                if not pb.cm.evaluate(st, best.dp, b).feasible:
                    continue
                moves += 1
                t = simulate_stages(pb.cm, st, best.dp).iteration_time_s
                assert got <= t * (1 + 1e-9), f"moving a layer from stage {src} to {dst}: {t:.4f} s < {got:.4f} s"
    assert moves >= 10


def test_a_ranking_budget_that_stops_the_pricing_says_so_with_a_lower_bound():
    """HARP Setting 1 under H-1F1B prices ~97,000 actions of its pool: a budget of 20,000 stops it. The
    result lists the ranking budget under `bounded` and a lower bound no higher than its plan's time; the
    default budget prices the whole pool (exact) and returns a plan at least as fast."""
    from pathlib import Path
    from heteropp.auto.planning import load_problem
    ex = Path(__file__).resolve().parents[2] / "examples"
    pb = load_problem(str(ex / "clusters/harp.yaml"), str(ex / "models/gpt-harp.yaml"),
                      str(ex / "training/harp-h1f1b.yaml"))
    cut = run_search(pb, baselines=False, rank_actions=20_000)
    assert any(b.startswith("ranking budget 20,000") for b in cut.bounded), cut.bounded
    assert cut.lower_bound_s is not None and cut.lower_bound_s <= cut.best.time_s
    whole = run_search(pb, baselines=False)
    assert not any(b.startswith("ranking budget") for b in whole.bounded)
    assert whole.best.time_s <= cut.best.time_s * (1 + 1e-12)


def test_the_front_door_takes_the_ranking_budget_and_refuses_a_bad_one():
    from heteropp.auto.front_door import Budget, plan
    with pytest.raises(ValueError, match="Budget.rank_actions: 0; expected a positive number of simulated actions"):
        Budget(rank_actions=0)
    pb = cm_problem(problem(*EXPERIMENTS["Exp-A-2"], None))
    small = plan(pb, Budget(baselines=False, rank_actions=1))  # one plan priced (the first always is)
    assert any(b.startswith("ranking budget 1 simulated actions") for b in small.search.bounded)
    assert small.search.lower_bound_s <= small.plan.iteration_time_s
    whole = plan(pb, Budget(baselines=False))
    assert whole.plan.iteration_time_s <= small.plan.iteration_time_s
