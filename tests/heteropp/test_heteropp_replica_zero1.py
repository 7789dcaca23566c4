"""A plan of replica groups runs without ZeRO-1 (the engine keeps each holder's optimizer state whole,
heteropp/engine/replica_groups.py; HeteroAuto prices it so). Before, a hand-written replica plan without `zero1`
loaded as true, an explicit `zero1: true` was accepted, and `heteropp run --zero1` on such a plan printed that it
overrode the plan while the engine silently ran without ZeRO-1 all the same."""
from __future__ import annotations

import argparse

import pytest

from heteropp.cli import zero1_of
from heteropp.plan import Plan, ReplicaGroup, StagePlan
from heteropp.spec import SpecError


def _replica_dict(**extra) -> dict:
    plan = Plan.of_replicas([ReplicaGroup([StagePlan("A", 1, 2), StagePlan("A", 1, 2)], 3),
                             ReplicaGroup([StagePlan("B", 1, 1), StagePlan("B", 1, 3)], 5)], 1, num_layers=4)
    d = plan.to_dict()
    d.pop("zero1", None)
    return {**d, **extra}


def test_a_replica_plan_without_the_field_loads_as_run_without_zero1():
    assert Plan.from_dict(_replica_dict()).zero1 is False


def test_zero1_true_on_a_replica_plan_is_refused_naming_the_field():
    with pytest.raises(SpecError, match="zero1"):
        Plan.from_dict(_replica_dict(zero1=True), "plan.json")


def test_the_zero1_flag_on_a_replica_plan_is_refused():
    plan = Plan.from_dict(_replica_dict())
    with pytest.raises(SpecError, match="replica groups"):
        zero1_of(argparse.Namespace(zero1=True), plan)
    assert zero1_of(argparse.Namespace(zero1=False), plan) is False
    assert zero1_of(argparse.Namespace(zero1=None), plan) is False


def test_a_plan_of_one_stage_list_keeps_its_default():
    d = Plan([StagePlan("A", 1, 4)], dp=1, micro_batch_size=1, micro_batches=2, num_layers=4).to_dict()
    d.pop("zero1", None)
    assert Plan.from_dict(d).zero1 is True
