"""A slowed chip is detected from per-stage step timings against the plan's cost-model prediction (real
processes; one rank's compute actions are slowed by a fixed delay, standing in for a throttled chip), and an
even run raises no alarm."""
from __future__ import annotations

import json
import os

import pytest

from heteropp.engine import RunConfig, launch
from heteropp.engine.elastic_launch import CPU_CGROUP
from heteropp.plan import Plan, StagePlan
from heteropp.spec import PRESETS

from .elastic_run import TWO_CPU, ElasticRun, throttled_until_replan
from .long_tests import long_test

STEPS = 7
# The two ranks share this machine's cores with whatever else runs: an even run's stages were seen 2.1x apart
# over a whole window (load ~5). The planted slowdown is ~11x: judged at 4x, the one is found, the other not.
SHARED_HOST_THRESHOLD = 4.0


# equal predictions for two equal halves of the tiny model (the head is small beside four layers)
PLAN = Plan([StagePlan("A", 1, 4, est_time_s=0.01), StagePlan("B", 1, 4, est_time_s=0.01)], dp=1,
            micro_batch_size=1, micro_batches=4, num_layers=8)


def _run(tmp_path, plan: Plan, name: str, threshold: float = SHARED_HOST_THRESHOLD, **kw) -> list[dict]:
    log = tmp_path / f"{name}.jsonl"
    launch(RunConfig(plan=plan.to_dict(), model=RunConfig.model_dict(PRESETS["tiny"]), steps=STEPS, backend="gloo",
                     chip_map={"A": "cpu", "B": "cpu"}, loss_log=str(log),
                     options={"straggler_threshold": threshold}, **kw))
    return [json.loads(x) for x in log.read_text().splitlines()]


def check_slowed_and_even(tmp_path, plan: Plan) -> None:
    """Rank 1 slowed by 0.1 s per compute action: only its watch slot (1: the second stage, or the second
    replica group's stage) is reported, from a full window of steps on; an even run reports nothing."""
    slowed = _run(tmp_path, plan, "slow", slow_rank=1, slow_s=0.1)
    flagged = [r["stragglers"] for r in slowed if "stragglers" in r]
    assert flagged and all(set(f) == {"1"} and f["1"] > SHARED_HOST_THRESHOLD for f in flagged), slowed
    assert "stragglers" not in slowed[0]  # judged over a window of steps, not one
    even = _run(tmp_path, plan, "even")
    assert not any("stragglers" in r for r in even)


@pytest.mark.slow
def test_a_slowed_stage_is_reported_and_an_even_run_is_not(tmp_path) -> None:
    check_slowed_and_even(tmp_path, PLAN)
    # the run's threshold is the watch's: ~11x slower is no straggler at 100x
    assert not any("stragglers" in r for r in _run(tmp_path, PLAN, "lenient", threshold=100.0, slow_rank=1, slow_s=0.1))


@pytest.mark.skipif(not os.access(CPU_CGROUP, os.W_OK), reason="needs cgroup v1's cpu controller, writable (root)")
@long_test("3-4 min on 2 cores (a throttled host restarts slowly)")
def test_a_throttled_host_is_replanned_around_when_the_gain_pays_for_the_restart(tmp_path) -> None:
    """`heteropp run --elastic` over two emulated hosts (torch elastic agents, gloo over loopback); the `small`
    host's agent and workers are throttled to a tenth of a core with a cpu cgroup while it trains (its
    restarted workers are born inside it). Its stage is found slow, rank 0 judges a re-plan worth its restart
    (many steps left), the round ends, and the next one plans with `small` at its measured speed (judged
    again as the slowdown climbs): the last round puts fewer layers on `small` than the first, or none. Each
    round's steps equal running its plan by hand from the checkpoint it resumed from (or afresh)."""
    # a round waits --timeout for its workers: the throttled host's restarted ones import torch at 0.1 core
    run = ElasticRun(tmp_path, steps=40, every=4, timeout_s=120)
    verdict, got = throttled_until_replan(run, "small")
    assert verdict["chip"] == "small" and verdict["slowdown"] > 1.5, verdict
    assert verdict["gain_s"] > verdict["cost_s"] > 0, verdict
    rounds = run.rounds()
    assert len(rounds) >= 2 and all(r["chips"] == {"big": 2, "small": 2} for r in rounds)
    assert rounds[-1]["speeds"]["small"] <= verdict["speeds"]["small"] < 1

    def on_small(r: dict) -> int:
        return sum(s.layers for s in Plan.load(run.ck / f"plan-round{r['round']}.json").stages if s.chip == "small")

    assert on_small(rounds[-1]) < on_small(rounds[0]), [r["plan"] for r in rounds]
    for r, nxt in zip(rounds[1:], rounds[2:] + [None]):
        run.check_by_hand(r, got, upto=nxt["resume_from"] if nxt else None)


def test_a_re_plan_pays_only_for_a_real_slowdown_and_enough_steps_left() -> None:
    """The re-plan rule of an elastic round, in this process: HeteroAuto's plan for two-cpu's 2 big + 2 small
    chips, then the `small` type found slower by a factor. The measured numbers are given (step time 1 s, a
    restart of 10 s, 2 steps to redo)."""
    from heteropp.engine.elastic import RDZV_S, live_cluster, replan, replan_verdict
    from heteropp.spec import load_cluster
    cluster = live_cluster(load_cluster(TWO_CPU), ["big", "big", "small", "small"])
    train = {"global_batch": 8, "micro_batch_size": 1, "dtype": "fp32", "schedule": "1f1b"}
    m = PRESETS["tiny"]
    plan = replan(cluster, m, train)
    assert "small" in {s.chip for s in plan.stages}

    def verdict(factor: float, left: int) -> dict:
        return replan_verdict(cluster, m, train, plan, "small", factor, 1.0, left, 10.0, 2)

    # not slower than planned: the planner's own plan again, nothing to gain however long the run
    assert verdict(1.0, 10_000)["gain_s"] <= 0 and not verdict(1.0, 10_000)["replan"]
    slow = verdict(10.0, 1000)
    assert slow["replan"] and slow["cost_s"] == 10.0 + RDZV_S + 2 * 1.0
    assert "small" not in " ".join(slow["new_plan"][:-1])  # 10x slower: the plan leaves `small` idle
    # the gain is per step left: too few steps left do not pay for the restart
    per_step = slow["gain_s"] / 1000
    few = int(slow["cost_s"] / per_step)
    assert not verdict(10.0, few)["replan"] and verdict(10.0, few + 1)["replan"]


def test_a_restarts_cost_counts_the_steps_since_the_newest_snapshot_not_the_disk_checkpoint(tmp_path) -> None:
    """The steps a straggler re-plan trains again, judged at step 9 with the newest disk checkpoint at step 4:
    without snapshots 5 (steps 5-9); with a snapshot every step 1 (step 8's is held: only step 9 is lost); every
    3 steps, 3 (step 6's). In this process: HeteroAuto's plan for two-cpu's chips, a checkpoint directory."""
    import time as _time

    from heteropp.engine.elastic import StragglerReplan, live_cluster, replan
    from heteropp.engine.straggler import StragglerWatch
    from heteropp.spec import load_cluster
    cluster = live_cluster(load_cluster(TWO_CPU), ["big", "big", "small", "small"])
    train = {"global_batch": 8, "micro_batch_size": 1, "dtype": "fp32", "schedule": "1f1b"}
    plan = replan(cluster, PRESETS["tiny"], train)
    ck = tmp_path / "ck" / "step-00000004"
    ck.mkdir(parents=True)
    (ck / "trainer.json").write_text("{}")
    cfg = RunConfig(plan=plan.to_dict(), model=RunConfig.model_dict(PRESETS["tiny"]), steps=40,
                    options={"checkpoint_dir": str(ck.parent)})
    k = next(i for i, s in enumerate(plan.stages) if s.chip == "small")
    for every, redo in ((0, 5), (1, 1), (3, 3)):
        policy = StragglerReplan(cfg, cluster, {}, train, plan, 0, _time.time(), every)
        assert policy.judge(StragglerWatch(plan), {k: 3.0}, 9)["redo_steps"] == redo, every
