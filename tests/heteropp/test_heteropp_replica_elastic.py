"""`heteropp run --elastic` from a plan of replica groups: every round re-plans for the chips present with replica
groups allowed (the faster of those and one stage list by the cost model), ranks take their places group by
group, and a lost host is re-planned around. The cluster: one fast and one slow chip joined by a slow link, a
model of long sequences, so that each chip running its own pipeline on its share of the batch (one gradient
all-reduce per step over the link) beats one pipeline across the link (activations every micro-batch) and the
fast chip alone. The real run (HETEROPP_LONG_TESTS=1) emulates the two hosts with torch elastic agents on this
machine (processes over loopback, gloo)."""
from __future__ import annotations

import json
import subprocess
import sys


from heteropp.engine import train_reference
from heteropp.engine.elastic import assign, replan
from heteropp.plan import Plan, ReplicaGroup, StagePlan
from heteropp.spec import ModelSpec, cluster_from_dict

from .elastic_run import ElasticRun
from .long_tests import long_test


def _chip(name: str, tflops: float) -> dict:
    return {"name": name, "count": 1, "memory_gb": 4, "peak_tflops": tflops, "chips_per_node": 1, "tp_max": 1,
            "intra_node_bw": 5, "network_bw": 2, "device": "cpu"}


CLUSTER = {"name": "fast-slow", "chips": [_chip("fast", 0.2), _chip("slow", 0.1)],
           "links": [{"between": ["fast", "slow"], "bandwidth": 0.05}]}
MODEL = ModelSpec("long", layers=4, hidden=32, heads=4, kv_heads=2, ffn=64, vocab=128, seq_len=256)
# ZeRO-1, the default: each part's optimizer state sharded over its holders in every group
TRAIN = {"global_batch": 16, "micro_batch_size": 1, "dtype": "fp32", "zero1": True, "schedule": "1f1b"}
# what `heteropp run --elastic` is given: every round re-plans, so only its batch, schedule, kind and zero1 matter
GIVEN = Plan.of_replicas([ReplicaGroup([StagePlan("fast", 1, 4)], 8), ReplicaGroup([StagePlan("slow", 1, 4)], 8)],
                         1, schedule="1f1b", num_layers=MODEL.layers, zero1=True)


def test_ranks_take_their_places_group_by_group() -> None:
    """Group 0's stages, then group 1's, each from the ranks of its chip type in rank order; the rest idle."""
    plan = Plan.of_replicas([ReplicaGroup([StagePlan("big", 1, 2), StagePlan("small", 1, 2)], 2),
                             ReplicaGroup([StagePlan("small", 1, 1), StagePlan("big", 1, 3)], 2)], 1,
                            schedule="1f1b", num_layers=4)
    chips = ["small", "small", "big", "big", "small"]  # world ranks by host, as the agents numbered them
    # plan rank 0: group 0's big stage, 1: its small stage, 2: group 1's small stage, 3: its big stage
    assert assign(plan, chips) == [2, 0, 1, 3]  # rank 4 idle


def test_a_round_re_plans_replica_groups_where_they_are_faster() -> None:
    cluster = cluster_from_dict(CLUSTER, "cluster")
    one = replan(cluster, MODEL, TRAIN)
    groups = replan(cluster, MODEL, TRAIN, per_replica=True)
    assert not one.replicas and groups.replicas
    assert [[s.chip for s in g.stages] for g in groups.groups] == [["fast"], ["slow"]] and groups.zero1
    assert groups.iteration_time_s < one.iteration_time_s and groups.global_batch == TRAIN["global_batch"]
    # the slow chip lost: the fast one alone, one stage list
    alone = replan(cluster_from_dict({**CLUSTER, "chips": [_chip("fast", 0.2)], "links": []}, "cluster"), MODEL,
                   TRAIN, per_replica=True)
    assert not alone.replicas and {s.chip for s in alone.stages} == {"fast"}


def _write(tmp_path) -> list[str]:
    """The cluster, model and plan files; the `heteropp run --elastic` command line that takes them."""
    (tmp_path / "cluster.json").write_text(json.dumps(CLUSTER))
    (tmp_path / "model.json").write_text(json.dumps({k: v for k, v in MODEL.__dict__.items()
                                                     if k != "explicit_head_dim"}))
    GIVEN.save(tmp_path / "plan.json")
    return [sys.executable, "-m", "heteropp", "run", "--elastic", "--plan", str(tmp_path / "plan.json"), "--model",
            str(tmp_path / "model.json"), "--cluster", str(tmp_path / "cluster.json"), "--checkpoint-dir",
            str(tmp_path / "ck"), "--backend", "gloo"]


def test_elastic_write_config_takes_a_plan_of_replica_groups(tmp_path) -> None:
    """It exited 2 (replica groups were not re-planned); the config now says rounds re-plan them."""
    r = subprocess.run([*_write(tmp_path), "--write-config", str(tmp_path / "elastic.json")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "elastic.json").read_text())["elastic"]["per_replica"] is True


@long_test("~1 min on 2 cores")
def test_a_run_of_replica_groups_loses_a_host_and_goes_on_alone(tmp_path) -> None:
    """Round 1 runs replica groups (each chip its own pipeline) with ZeRO-1 (each chip steps half of every part's
    Adam state and all-gathers the weights), each rank's state also in the hosts' memory
    every step (the default); the slow host is SIGKILLed after the step-3 checkpoint; round 2 resumes (from
    memory, or the disk) on the fast chip alone and finishes. Every step's loss, each from the round that logged
    it last, follows the single-process reference (fp32 sums in other orders over 8 Adam steps: 1e-4
    relative)."""
    steps, every = 8, 3
    _write(tmp_path)
    run = ElasticRun(tmp_path, steps=steps, every=every, plan=GIVEN.to_dict(), model=str(tmp_path / "model.json"),
                     cluster=tmp_path / "cluster.json", snapshot_every=1)
    run.wait_step(every + 1)  # the step-3 checkpoint is complete before step 4 is logged
    run.kill(run.host("slow"))
    got = run.finish()
    rounds = run.rounds()
    first, last = Plan.load(run.ck / "plan-round1.json"), Plan.load(run.ck / f"plan-round{rounds[-1]['round']}.json")
    assert [[s.chip for s in g.stages] for g in first.groups] == [["fast"], ["slow"]] and first.zero1
    assert not last.replicas and rounds[-1]["chips"] == {"fast": 1} and rounds[-1]["resume_from"] >= every
    want = train_reference(MODEL, steps, TRAIN["global_batch"], verbose=False)["losses"]
    for step, loss in got.items():
        assert abs(loss - want[step - 1]) <= 1e-4 * abs(want[step - 1]), (step, loss, want[step - 1])
