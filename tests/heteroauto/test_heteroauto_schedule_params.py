"""The planner chooses the parameters of the schedules that take some, by simulating each option: H-1F1B's
extra warm-up per boundary and interleaved 1F1B's model chunks per stage. The plan it writes validates,
simulates to the time it states, and (interleaved) the engine trains it to the single-process reference.
Each choice is checked against a brute force over the options, simulated independently of the planner."""
from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from heteropp.auto.analytic import analytic_profile
from heteropp.auto.costs import CostModel, micro_batches
from heteropp.auto.plan_sim import plan_stages, schedule_params, simulate_plan, simulate_stages
from heteropp.auto.planning import Problem, load_problem, run_search, to_plan
from heteropp.plan import Plan
from heteropp.schedules import kind
from heteropp.spec import TrainSpec, cluster_from_dict

from heteroauto_helpers import chip, make_problem, with_schedule


def test_h1f1b_warmup_is_the_best_of_a_brute_force_over_warmups():
    """Slow link between two chip types: every extra warm-up vector up to 6 per boundary, within memory,
    simulated; the planner's choice is the best of them (here HARP's rule alone, one extra micro-batch,
    is 2% slower than two), so no slower than HARP's rule or plain 1F1B."""
    cm = make_problem([chip("X", 2, 80.0, tp_max=1), chip("Y", 2, 80.0, tp_max=1)], {"X": 1.0, "Y": 0.8},
                      layers=8, gb=16, links=[{"between": ["X", "Y"], "bandwidth": 0.02}])
    pb = with_schedule(cm, "h1f1b")
    res = run_search(pb, progress=None)
    plan = to_plan(pb, res.best, None, "auto", res)
    assert plan.schedule == "h1f1b"
    stages, p = plan_stages(plan), len(plan.stages)
    caps = [cm.cluster.chip(s.chip).usable_bytes for s in stages]
    b = micro_batches(pb.train, plan.dp)
    times = {}
    for extra in itertools.product(range(7), repeat=p - 1):
        q = {"extra_warmup": list(extra)}
        mem = pb.cm.evaluate(stages, plan.dp, b, "h1f1b", params=q).stage_memory_bytes
        if all(m <= c for m, c in zip(mem, caps)):
            times[extra] = simulate_stages(pb.cm, stages, plan.dp, "h1f1b", params=q).iteration_time_s
    best = min(times.values())
    rule = tuple(schedule_params(pb.cm, stages, plan.dp, "h1f1b")["extra_warmup"])
    assert plan.iteration_time_s <= best * (1 + 1e-9)
    assert plan.iteration_time_s <= times[(0,) * (p - 1)] * (1 + 1e-9)
    if rule in times:
        assert plan.iteration_time_s <= times[rule] * (1 + 1e-9)
    assert plan.iteration_time_s == pytest.approx(simulate_plan(pb.cm, plan).iteration_time_s)


def test_harp_h1f1b_plan_is_no_slower_than_harps_rule():
    ex = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples"
    pb = load_problem(str(ex / "clusters/harp.yaml"), str(ex / "models/gpt-harp.yaml"),
                      str(ex / "training/harp-h1f1b.yaml"))
    res = run_search(pb, progress=None)
    plan = to_plan(pb, res.best, None, "auto", res)
    rule = schedule_params(pb.cm, plan_stages(plan), plan.dp, "h1f1b")
    by_rule = simulate_stages(pb.cm, plan_stages(plan), plan.dp, "h1f1b", params=rule).iteration_time_s
    assert plan.iteration_time_s <= by_rule * (1 + 1e-9)


def _interleaving_problem() -> Problem:
    """Two equal chips on a fast link, four layers, four micro-batches: the 1F1B bubble is large and two
    chunks per stage halve it."""
    c = [dict(chip("A", 1, 4.0, tp_max=1), intra_node_bw=50.0, network_bw=50.0, peak_tflops=0.001),
         dict(chip("B", 1, 4.0, tp_max=1), intra_node_bw=50.0, network_bw=50.0, peak_tflops=0.001)]
    from tests.heteropp.heteropp_helpers import MODEL
    cl = cluster_from_dict({"name": "ab", "chips": c}, "test")
    train = TrainSpec(global_batch=4, micro_batch_size=1, dtype="fp32", schedule="interleaved")
    cm = CostModel(cl, MODEL, replace(train, schedule="1f1b"), analytic_profile(cl, MODEL, train))
    return Problem(cl, MODEL, train, cm)


def test_harps_launch_rule_by_hand():
    """HARP's code launches 1F1B inside a cluster and 1, 2 or 3 steps across one as the boundary's cost is
    below a tenth of the stage-cost cap, below half of it, or above (extra 0, 1, 2); the cap here is the
    largest stage or boundary cost, 10 (stage times 4 and 10; boundary costs 0.5, 0.99, 1, 4.99, 5, 6)."""
    from heteropp.schedules import harp_launch_extra
    costs = [0.5, 0.99, 1.0, 4.99, 5.0, 6.0]
    assert harp_launch_extra([4.0, 10.0], costs, [True] * 6) == [0, 0, 1, 1, 2, 2]
    assert harp_launch_extra([4.0, 10.0], costs, [False] * 6) == [0] * 6  # inside a cluster
    # a boundary dearer than every stage sets the cap itself, so it gets the most
    assert harp_launch_extra([1.0, 2.0], [8.0, 0.5], [True, True]) == [2, 0]


def test_interleaved_plan_chooses_chunks_by_brute_force_and_round_trips():
    pb = _interleaving_problem()
    res = run_search(pb, progress=None)
    plan = to_plan(pb, res.best, None, "auto", res)
    assert plan.schedule == "interleaved" and plan.chunks == 2 and len(plan.stages) == 2 * plan.devices
    again = Plan.from_dict(plan.to_dict())  # validates: chunks sit on their group, layers contiguous
    assert [s.layers for s in again.stages] == [1, 1, 1, 1]
    # brute force: the searched stages as 1 or 2 chunks each, simulated
    phys = plan_stages(plan)[:plan.devices]
    merged = [replace(s, layers=sum(v.layers for v in plan_stages(plan)[k::plan.devices])) for k, s in enumerate(phys)]
    one = simulate_stages(pb.cm, merged, 1, "interleaved", params={"chunks": 1}).iteration_time_s
    assert plan.iteration_time_s < one
    assert plan.iteration_time_s == pytest.approx(simulate_plan(pb.cm, plan).iteration_time_s)


def test_engine_trains_the_planned_interleaved_plan_to_the_reference():
    from heteropp.engine import launch
    from tests.heteropp.heteropp_helpers import check_losses, config, losses, reference
    pb = _interleaving_problem()
    plan = to_plan(pb, run_search(pb, progress=None).best, None, "auto")
    assert plan.chunks == 2
    res = launch(config(plan, ("interleaved",)))
    check_losses(losses(res, "interleaved"), reference(plan.global_batch)["losses"], "interleaved")


def test_interleaved_chunks_have_one_default_for_plan_simulator_and_run():
    """A plan that names interleaved 1F1B without chunks: the plan, the generator, the in-flight counts and
    the simulator all take the registry's one default (the plan and the registry once disagreed: 1 and 2)."""
    from heteropp.plan import StagePlan
    from heteropp.schedules import missing_params
    pb = _interleaving_problem()
    stages = [StagePlan("A", 1, 2), StagePlan("B", 1, 2)]
    bare = Plan(stages, dp=1, micro_batch_size=1, micro_batches=4, schedule="interleaved")
    explicit = Plan(stages, dp=1, micro_batch_size=1, micro_batches=4, schedule="interleaved",
                    schedule_params={"chunks": kind("interleaved").defaults["chunks"]})
    assert bare.chunks == explicit.chunks == 1 and not missing_params("interleaved", {})
    assert simulate_plan(pb.cm, bare).iteration_time_s == simulate_plan(pb.cm, explicit).iteration_time_s


def _peak_activations(schedule: str, p: int, b: int, params: dict) -> list[float]:
    """Per stage, the most micro-batch activations held at once, in whole-stage units, counted on the
    schedule's own actions: a forward of one of v chunks saves 1/v, its backward frees it."""
    from heteropp.schedules import build
    v = params.get("chunks", 1)
    out = []
    for acts in build(schedule, p, b, params):
        held = peak = 0.0
        for a in acts:
            held += 1 / v if a.op == "F" else -1 / v if a.op == "B" else 0.0
            peak = max(peak, held)
        out.append(peak)
    return out


def test_interleaved_with_one_chunk_holds_more_than_1f1b_and_its_plan_fits():
    """Two chips of 4 GB, two layers, four micro-batches: 1F1B's first stage holds 2 micro-batches (3.76 GB),
    interleaved 1F1B with one chunk warms up with 2 (p - 1) forwards and holds 3 (4.76 GB), more than it has.
    The one option interleaved has here (a chunk per layer) must run with the first stage recomputing, as
    the brute force finds; the planner chose it without checking its memory."""
    from heteropp.auto.brute_force import brute_force
    cm = make_problem([chip("X", 1, 4.0, tp_max=1), chip("Y", 1, 4.0, tp_max=1)], {"X": 1.0, "Y": 1.0},
                      layers=2, gb=4, links=[{"between": ["X", "Y"], "bandwidth": 2.0}])
    pb = with_schedule(cm, "interleaved")
    plan = to_plan(pb, run_search(pb, progress=None).best, None, "auto")
    assert plan.schedule_params == {"chunks": 1}
    held = _peak_activations("interleaved", 2, plan.micro_batches, plan.schedule_params)
    assert held[0] > _peak_activations("1f1b", 2, plan.micro_batches, {})[0]
    for k, s in enumerate(plan.stages):
        need = cm.memory(s.chip, s.tp, s.recompute, plan.dp, s.layers, round(held[k]), k == 0, k == 1)
        assert need <= cm.cluster.chip(s.chip).usable_bytes, (k, s, need)
    assert plan.iteration_time_s == pytest.approx(brute_force(pb)[0], rel=1e-9)
