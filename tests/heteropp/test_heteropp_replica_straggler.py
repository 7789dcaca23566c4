"""Straggler re-plans in a run of replica groups (each group its own pipeline): the watch judges every group's
stages together, each against its own group's estimate (heteropp/engine/straggler.py), and the re-plan rule
prices the running plan of groups by the groups' simulator (auto/replica_sim.py) as HeteroAuto priced it when
planning. Before, the groups' stages carried no estimate to the watch, so it judged nothing, and the rule
refused a plan of groups (plan_sim.simulate_plan raises on one)."""
from __future__ import annotations

import os
import time

import pytest

from heteropp.engine import RunConfig, train_reference
from heteropp.engine.elastic import StragglerReplan, replan, replan_verdict
from heteropp.engine.elastic_launch import CPU_CGROUP
from heteropp.engine.straggler import StragglerWatch
from heteropp.plan import Plan, ReplicaGroup, StagePlan
from heteropp.spec import cluster_from_dict

from .elastic_run import ElasticRun, throttled_until_replan
from .test_heteropp_replica_elastic import CLUSTER, GIVEN, MODEL, TRAIN, _write
from .test_heteropp_straggler import check_slowed_and_even
from .long_tests import long_test

# each group all eight layers on one chip, two micro-batches: group 0 on an A chip (rank 0), group 1 on a B chip
# (rank 1). Two ranks, as in the one-list straggler test (more would share this host's two cores unevenly), and
# alike work per group (a tiny model's compute is not proportional to its micro-batches: a step's own overhead
# weighs; test_the_watch_numbers_every_groups_stages_with_their_own_micro_batches checks the scaling by hand)
GROUPS = Plan.of_replicas([ReplicaGroup([StagePlan("A", 1, 8, est_time_s=0.02)], 2),
                           ReplicaGroup([StagePlan("B", 1, 8, est_time_s=0.02)], 2)], 1, schedule="1f1b",
                          num_layers=8)


# Judged on measured step times: on a loaded 2-core host an even run can read 1.5x slow on one rank, so it
# runs with the other straggler timing runs in `make test-long`.
@long_test("timing-judged")
def test_a_slowed_stage_of_the_second_group_is_reported_and_an_even_run_is_not(tmp_path, capfd) -> None:
    """Rank 1 (group 1's stage: watch slot 1, after group 0's) slowed; the console names its group."""
    check_slowed_and_even(tmp_path, GROUPS)
    assert "straggler: group 1 stage 0 " in capfd.readouterr().err


def test_the_watch_numbers_every_groups_stages_with_their_own_micro_batches() -> None:
    """By hand: slots in rank order, each predicted as its estimate times its group's micro-batches."""
    plan = Plan.of_replicas([ReplicaGroup([StagePlan("A", 1, 4, est_time_s=0.01),
                                           StagePlan("B", 1, 4, est_time_s=0.03)], 2),
                             ReplicaGroup([StagePlan("B", 1, 8, est_time_s=0.02)], 3)], 1, schedule="1f1b",
                            num_layers=8)
    w = StragglerWatch(plan)
    assert w.predicted == pytest.approx([0.02, 0.06, 0.06]) and w.chips == ["A", "B", "B"]
    assert w.slot_of(1, 0) == 2 and w.where[2] == (1, 0)


CL = cluster_from_dict(CLUSTER, "cluster")


def test_the_re_plan_rule_prices_a_running_plan_of_replica_groups() -> None:
    """The fast chip and the slow one each run a pipeline (the cost model's best for them, priced at
    planning). Not slower than planned: priced as planned, nothing to gain. The slow chip 10x slower: its
    group alone computes 5 micro-batches x 10 x its estimate, the running plan is priced above that, the fast
    chip alone is the better plan and, with many steps left, the re-plan pays."""
    groups = replan(CL, MODEL, TRAIN, per_replica=True)
    assert [[s.chip for s in g.stages] for g in groups.groups] == [["fast"], ["slow"]]
    same = replan_verdict(CL, MODEL, TRAIN, groups, "slow", 1.0, 1.0, 10_000, 10.0, 2, per_replica=True)
    assert same["predicted_now_s"] == pytest.approx(groups.iteration_time_s)
    assert same["gain_s"] <= 0 and not same["replan"]
    slow = replan_verdict(CL, MODEL, TRAIN, groups, "slow", 10.0, 1.0, 10_000, 10.0, 2, per_replica=True)
    g1 = groups.groups[1]
    assert slow["predicted_now_s"] >= g1.micro_batches * 10 * g1.stages[0].est_time_s
    assert slow["new_plan"][0].startswith("fast") and "slow" not in " ".join(slow["new_plan"])
    assert slow["predicted_new_s"] < slow["predicted_now_s"] and slow["replan"]


def test_a_straggler_in_the_second_group_is_judged_on_its_chip(tmp_path) -> None:
    """The policy of an elastic round told that slot 1 (group 1's stage 0, the slow chip) runs 10x slow."""
    groups = replan(CL, MODEL, TRAIN, per_replica=True)
    cfg = RunConfig(plan=groups.to_dict(), model=RunConfig.model_dict(MODEL), steps=10_000,
                    options={"checkpoint_dir": str(tmp_path)})
    policy = StragglerReplan(cfg, CL, {}, TRAIN, groups, 0, time.time(), 1, per_replica=True)
    v = policy.judge(StragglerWatch(groups), {1: 10.0}, 9)
    assert (v["group"], v["stage"], v["chip"]) == (1, 0, "slow") and v["replan"], v
    assert v["speeds"] == {"slow": 0.1}


@pytest.mark.skipif(not os.access(CPU_CGROUP, os.W_OK), reason="needs cgroup v1's cpu controller, writable (root)")
@long_test("1-2 min on 2 cores (a throttled host restarts slowly)")
@pytest.mark.timeout(600)
def test_a_throttled_host_of_a_replica_group_is_replanned_around(tmp_path) -> None:
    """End to end: `heteropp run --elastic` from a plan of replica groups over the fast and slow hosts (torch
    elastic agents, gloo over loopback). Round 1 runs each chip its own pipeline; the slow host's agent and
    workers are throttled to a tenth of a core with a cpu cgroup while it trains. The watch finds group 1's
    stage slow, rank 0 judges a re-plan worth its restart, and the next round plans with the slow chip at its
    measured speed: fewer of the batch's micro-batches on it than in round 1, or none (then it is idle). The run
    ends with its last step, and every step's loss, from the round that logged it last, follows the
    single-process reference (1e-4 relative, as without a throttle)."""
    steps, every = 40, 4
    _write(tmp_path)
    run = ElasticRun(tmp_path, steps=steps, every=every, plan=GIVEN.to_dict(), model=str(tmp_path / "model.json"),
                     cluster=tmp_path / "cluster.json", snapshot_every=1, timeout_s=120)
    # the round after the re-plan leaves the slow host idle: its worker reads the end from world rank 0's store,
    # which must outlive that (it did not: the idle worker failed, its agent started a round of its own, and the
    # fast host's agent waited out torch elastic's exit barrier, 300 s, before the run ended)
    verdict, got = throttled_until_replan(run, "slow")
    assert verdict["chip"] == "slow" and verdict["group"] == 1 and verdict["slowdown"] > 1.5, verdict
    assert verdict["gain_s"] > verdict["cost_s"] > 0, verdict
    rounds = run.rounds()
    first = Plan.load(run.ck / "plan-round1.json")
    assert [[s.chip for s in g.stages] for g in first.groups] == [["fast"], ["slow"]], first

    def on_slow(plan: Plan) -> int:  # micro-batches a step computes on the slow chip
        return sum(g.micro_batches for g in plan.groups if any(s.chip == "slow" for s in g.stages))

    after = next(r for r in rounds if r["started"] > verdict["time"])
    assert on_slow(Plan.load(run.ck / f"plan-round{after['round']}.json")) < on_slow(first), [r["plan"] for r in rounds]
    assert all(r["resume_from"] < steps for r in rounds), [r["plan"] for r in rounds]  # no round after the end
    want = train_reference(MODEL, steps, TRAIN["global_batch"], verbose=False)["losses"]
    for step, loss in got.items():
        assert abs(loss - want[step - 1]) <= 1e-4 * abs(want[step - 1]), (step, loss, want[step - 1])
