"""The search ranks plans under the parameter-free schedule it searches as (1F1B); H-1F1B's extra warm-up
and interleaved 1F1B's chunks are chosen afterwards. Its final candidates (the best and the kept runners-up)
are then re-ranked by their simulated time with each one's best parameters, which can change the winner.
Checked against a brute force over (plan, parameters): every dp, order of chip types, layer split and
schedule parameter, each simulated (auto/brute_force.py)."""
from __future__ import annotations

import pytest

from heteropp.auto.brute_force import brute_force
from heteropp.auto.costs import StageSpec
from heteropp.auto.plan_sim import simulate_stages
from heteropp.auto.planning import best_params, run_search, to_plan
from heteropp.auto.search import search_auto

from heteroauto_helpers import chip, make_problem, with_schedule


CASES = {  # schedule: (chips X and Y as (count, memory GB), Y's time per layer against X's, layers, batch, link GB/s)
    "h1f1b": (((2, 8.0), (3, 20.0)), 0.8, 6, 6, 0.02),
    "interleaved": (((2, 20.0), (2, 20.0)), 0.8, 4, 4, 0.2),
}


@pytest.mark.parametrize("schedule", sorted(CASES))
def test_final_candidates_ranked_with_their_best_parameters_match_a_brute_force(schedule):
    (x, y), speed, layers, gb, link = CASES[schedule]
    cm = make_problem([chip("X", x[0], x[1], tp_max=1), chip("Y", y[0], y[1], tp_max=1)], {"X": 1.0, "Y": speed},
                      layers=layers, gb=gb, links=[{"between": ["X", "Y"], "bandwidth": link}])
    pb = with_schedule(cm, schedule)
    best = brute_force(pb)[0]
    plan = to_plan(pb, run_search(pb, progress=None).best, None, "auto")
    assert plan.schedule == schedule
    assert plan.iteration_time_s <= best * (1 + 1e-9)
    # the plan the search ranks first under 1F1B is slower with its own best parameters: the re-rank moved
    searched_first = search_auto(pb.cm, progress=None).best
    assert best_params(pb, searched_first)[2] > best * 1.02


def test_a_plan_the_search_does_not_rank_first_wins_with_its_parameters_as_the_brute_force_finds():
    """Three chip types joined by links of 0.05, 0.2 and 2 GB/s: under H-1F1B the fastest plan (X, then Z
    recomputing, then Y twice, with two extra warm-ups per boundary) is the fourth the search (1F1B's
    objective, without warm-up) returns. The re-rank covers every collected plan
    whose estimate with parameters is within the model's stated error of the best, so the planner finds
    the brute force's optimum (it kept a plan 2.3% slower when it re-ranked only the first four)."""
    from heteropp.auto.planning import POOL_MARGIN, RERANK_POOL
    links = [{"between": ["X", "Y"], "bandwidth": 0.05}, {"between": ["X", "Z"], "bandwidth": 0.2},
             {"between": ["Y", "Z"], "bandwidth": 2.0}]
    cm = make_problem([chip("X", 1, 12.0, tp_max=1), chip("Y", 2, 20.0, tp_max=1), chip("Z", 1, 8.0, tp_max=1)],
                      {"X": 1.0, "Y": 0.8, "Z": 0.5}, layers=5, gb=8, links=links)
    pb = with_schedule(cm, "h1f1b")
    best = brute_force(pb)[0]
    plan = to_plan(pb, run_search(pb, progress=None).best, None, "auto")
    assert plan.iteration_time_s <= best * (1 + 1e-9)
    # the larger space (extended.py) holds a faster plan still, Y on both sides of Z: 34.02 s against 35.01
    assert plan.iteration_time_s == pytest.approx(brute_force(pb, extended=True)[0], rel=1e-9)
    # the plan ranked first without parameters (by the objective, or as returned, by the full 1F1B estimate)
    # is 2.3% slower with its best parameters; the re-rank with parameters finds the brute force's
    for rerank in (False, True):
        res = search_auto(pb.cm, runners_up=RERANK_POOL, rerank=rerank, margin=POOL_MARGIN, progress=None)
        assert best_params(pb, res.best)[2] > best * 1.02


@pytest.mark.parametrize("schedule", ["h1f1b", "interleaved"])
def test_a_layer_split_the_search_does_not_rank_first_wins_with_its_parameters(schedule):
    """Three chip types joined by links of 0.2, 0.05 and 0.02 GB/s, five layers: the brute force's fastest
    plan (Y twice, X, Z, each with one layer but the first) is a collected plan's neighbour, one layer
    moved, that no plan the search ranks reaches with its best split under 1F1B. The re-rank's local search
    over single layer moves and single warm-up steps (planning.refine) finds it; the planner's plan was
    6.2% slower under both schedules when each plan kept its searched split."""
    links = [{"between": ["X", "Y"], "bandwidth": 0.2}, {"between": ["X", "Z"], "bandwidth": 0.05},
             {"between": ["Y", "Z"], "bandwidth": 0.02}]
    cm = make_problem([chip("X", 1, 20.0, tp_max=1), chip("Y", 2, 20.0, tp_max=1), chip("Z", 1, 8.0, tp_max=1)],
                      {"X": 1.0, "Y": 0.8, "Z": 0.8}, layers=5, gb=8, links=links)
    pb = with_schedule(cm, schedule)
    best = brute_force(pb)[0]
    plan = to_plan(pb, run_search(pb, progress=None).best, None, "auto")
    assert plan.iteration_time_s == pytest.approx(best, rel=1e-9)
    assert plan.iteration_time_s == pytest.approx(simulate_stages(
        pb.cm, [StageSpec(s.chip, s.tp, s.layers, s.recompute, s.inner_dp) for s in plan.stages], plan.dp, schedule,
        params=plan.schedule_params).iteration_time_s, rel=1e-12)


def test_no_plan_beats_the_brute_force_on_the_benchmarks_instances():
    """bench/heteroauto_vs_brute.py's first 8 interleaved instances of seed 0: the planner's plan is never
    faster than the brute force over plans that fit (on instance 6 it was, 30.02 s against 34.02 s, with
    a stage holding interleaving's in-flight count in 9.2 GB of 8). The brute force of the larger space,
    which the planner's plans now come from (idle chips, types interleaved)."""
    from bench.heteroauto_vs_brute import measure
    res = measure(8, 0, ("interleaved",), extended=True)["interleaved"]
    assert res["instances"] >= 2
    assert res["least_gap"] >= -1e-9


def test_the_benchmark_refuses_no_instances():
    from bench.heteroauto_vs_brute import main
    with pytest.raises(SystemExit) as e:
        main(["--instances", "0"])
    assert e.value.code == 2
