"""The search ranks plans under the parameter-free schedule it searches as (1F1B); H-1F1B's extra warm-up
and interleaved 1F1B's chunks are chosen afterwards. Its final candidates (the best and the kept runners-up)
are then re-ranked by their simulated time with each one's best parameters, which can change the winner.
Checked against a brute force over (plan, parameters): every dp, order of chip types, layer split and
schedule parameter, each simulated."""
from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from heteropp.auto.costs import StageSpec, micro_batches
from heteropp.auto.plan_sim import simulate_stages
from heteropp.auto.planning import Problem, best_params, run_search, to_plan, virtual_stages
from heteropp.auto.search import search_auto
from heteropp.auto.space import dp_candidates

from heteroauto_helpers import chip, make_problem, with_schedule


def _splits(n: int, k: int):
    for cuts in itertools.combinations(range(1, n), k - 1):
        b = (0, *cuts, n)
        yield [b[i + 1] - b[i] for i in range(k)]


def _options(schedule: str, stages: list[StageSpec], b: int):
    """Every parameter value of `schedule` on `stages` (with the stages the simulator runs)."""
    p = len(stages)
    if schedule == "interleaved":
        if b % p == 0:
            for v in range(1, min(s.layers for s in stages) + 1):
                yield {"chunks": v}, virtual_stages(stages, v)
    else:
        for extra in itertools.product(range(4), repeat=p - 1):
            yield {"extra_warmup": list(extra)}, stages


def brute_force(pb: Problem) -> float:
    """The least simulated time of any plan of one-chip stages (tp 1) with any parameters that fit in
    memory. A stage recomputes only where it does not fit otherwise: recompute adds compute and no
    transfer, and a stage's memory depends on its own flag alone, so that choice loses no plan."""
    cm, sched, best = pb.cm, pb.train.schedule, math.inf
    counts = {c.name: c.count for c in cm.cluster.chips}
    for dp in dp_candidates(cm.cluster, cm.train):
        b = micro_batches(cm.train, dp)
        for order in itertools.permutations(counts):
            seq = [n for n in order for _ in range(counts[n] // dp)]
            if len(seq) > cm.model.layers:
                continue
            for ls in _splits(cm.model.layers, len(seq)):
                plain = [StageSpec(c, 1, n, False) for c, n in zip(seq, ls)]
                caps = [cm.cluster.chip(c).usable_bytes for c in seq]
                for q, _ in _options(sched, plain, b):
                    mems = [cm.evaluate([replace(s, recompute=r) for s in plain], dp, b, sched,
                                        params=q).stage_memory_bytes for r in (False, True)]
                    if any(min(m0, m1) > c for m0, m1, c in zip(*mems, caps)):
                        continue
                    stages = [replace(s, recompute=m0 > c) for s, m0, c in zip(plain, mems[0], caps)]
                    run = virtual_stages(stages, q["chunks"]) if "chunks" in q else stages
                    best = min(best, simulate_stages(cm, run, dp, sched, params=q).iteration_time_s)
    return best


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
    best = brute_force(pb)
    plan = to_plan(pb, run_search(pb, progress=None).best, None, "auto")
    assert plan.schedule == schedule
    assert plan.iteration_time_s <= best * (1 + 1e-9)
    # the plan the search ranks first under 1F1B is slower with its own best parameters: the re-rank moved
    searched_first = search_auto(pb.cm, progress=None).best
    assert best_params(pb, searched_first)[2] > best * 1.02


def test_a_plan_the_search_ranks_fifth_wins_with_its_parameters_as_the_brute_force_finds():
    """Three chip types joined by links of 0.05, 0.2 and 2 GB/s: under H-1F1B the fastest plan (X, then Z
    recomputing, then Y twice, with two extra warm-ups per boundary) is not among the four plans the
    search's objective (1F1B's, without warm-up) ranks first. The re-rank covers every collected plan
    whose estimate with parameters is within the model's stated error of the best, so the planner finds
    the brute force's optimum (it kept a plan 2.3% slower when it re-ranked only the first four)."""
    from heteropp.auto.planning import POOL_MARGIN, RERANK_POOL
    links = [{"between": ["X", "Y"], "bandwidth": 0.05}, {"between": ["X", "Z"], "bandwidth": 0.2},
             {"between": ["Y", "Z"], "bandwidth": 2.0}]
    cm = make_problem([chip("X", 1, 12.0, tp_max=1), chip("Y", 2, 20.0, tp_max=1), chip("Z", 1, 8.0, tp_max=1)],
                      {"X": 1.0, "Y": 0.8, "Z": 0.5}, layers=5, gb=8, links=links)
    pb = with_schedule(cm, "h1f1b")
    best = brute_force(pb)
    plan = to_plan(pb, run_search(pb, progress=None).best, None, "auto")
    assert plan.iteration_time_s == pytest.approx(best, rel=1e-9)
    res = search_auto(pb.cm, runners_up=RERANK_POOL, margin=POOL_MARGIN, progress=None)
    assert min(best_params(pb, c)[2] for c in [res.best, *res.runners_up[:3]]) > best * 1.02


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
    best = brute_force(pb)
    plan = to_plan(pb, run_search(pb, progress=None).best, None, "auto")
    assert plan.iteration_time_s == pytest.approx(best, rel=1e-9)
    assert plan.iteration_time_s == pytest.approx(simulate_stages(
        pb.cm, [StageSpec(s.chip, s.tp, s.layers, s.recompute, s.inner_dp) for s in plan.stages], plan.dp, schedule,
        params=plan.schedule_params).iteration_time_s, rel=1e-12)
