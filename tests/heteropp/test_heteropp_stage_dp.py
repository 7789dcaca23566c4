"""Per-stage data parallelism: stages split every micro-batch's sequences over their own inner replicas
(stage 0 DP 2 x TP 1 next to stage 1 DP 1 x TP 2, and the reverse, and with two pipelines), activations and
gradients resharded along the batch dimension at each boundary, gradients reduced over each stage's own
replicas. Real processes; losses and gradients against the single-process reference."""
from __future__ import annotations

import functools

import pytest

from heteropp.engine import launch
from heteropp.plan import Plan, StagePlan
from tests.heteropp.heteropp_helpers import (MODEL, RTOL, check_losses, config, full_grads, losses, ref_grads,
                                             reference, rel)

SCHEDS = ("1f1b", "zbh1")
PLANS = {
    "dp2xtp1-dp1xtp2": Plan([StagePlan("A", 1, 2, inner_dp=2), StagePlan("B", 2, 2, inner_dp=1)], dp=1,
                            micro_batch_size=2, micro_batches=2, num_layers=MODEL.layers),
    "dp1xtp2-dp2xtp1": Plan([StagePlan("A", 2, 3, inner_dp=1), StagePlan("B", 1, 1, inner_dp=2)], dp=1,
                            micro_batch_size=2, micro_batches=2, num_layers=MODEL.layers),
    "outer2-dp2-dp1": Plan([StagePlan("A", 1, 1, inner_dp=2), StagePlan("B", 1, 3, inner_dp=1)], dp=2,
                           micro_batch_size=2, micro_batches=2, num_layers=MODEL.layers),
}


@functools.lru_cache(maxsize=None)
def _run(name: str) -> dict:
    return launch(config(PLANS[name], SCHEDS))


@pytest.mark.parametrize("name", list(PLANS))
def test_per_stage_dp_trains_to_the_reference(name: str) -> None:
    p = PLANS[name]
    res, want = _run(name), reference(p.global_batch)
    for sched in SCHEDS:
        check_losses(losses(res, sched), want["losses"], f"{name} {sched}")
        got, want_grads = full_grads(res, sched), ref_grads(want)
        worst = max((rel(got[n], want_grads[n]), n) for n in want_grads)
        assert worst[0] < RTOL, f"{name} {sched}: gradient of {worst[1]} off by {worst[0]:.2e}"


@pytest.mark.parametrize("name", list(PLANS))
def test_batch_resharding_sends_every_byte_once(name: str) -> None:
    p = PLANS[name]
    res = _run(name)
    one = p.micro_batch_size * MODEL.seq_len * MODEL.hidden * 4 * p.micro_batches * p.dp * 2  # two steps
    for direction in "FB":
        sent = sum(r["1f1b"]["bytes_sent"].get(f"{direction}0", 0) for r in res.values())
        assert sent == one, f"{direction}: {sent} bytes sent, one copy is {one}"


def test_plan_rejects_an_inner_dp_that_does_not_divide_the_micro_batch_and_old_versions() -> None:
    from heteropp.spec import SpecError
    bad = PLANS["dp2xtp1-dp1xtp2"].to_dict()
    bad["stages"][0]["inner_dp"] = 3
    with pytest.raises(SpecError, match=r"stages\[0\]\.inner_dp.*dividing micro_batch_size=2"):
        Plan.from_dict(bad)
    old = PLANS["dp2xtp1-dp1xtp2"].to_dict()
    old["version"] = 1
    with pytest.raises(SpecError, match="'version': got 1.*predate per-stage data parallelism"):
        Plan.from_dict(old)
    assert PLANS["outer2-dp2-dp1"].world_size == 2 * 2 + 2 and PLANS["outer2-dp2-dp1"].chips_used() == {"A": 4, "B": 2}
