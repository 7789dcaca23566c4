"""TP sizes above the number of key/value heads (grouped-query attention with few KV heads, like the tiny
preset's 2): each KV head is replicated on tp // kv_heads ranks and their weight gradients summed. Losses
and gradients against the single-process reference, under a schedule that defers weight gradients (ZB-H1)
and one that does not (1F1B), with resharding across TP 4 -> 1 -> 2.
"""
from __future__ import annotations

import functools

import pytest

from heteropp.engine import RunConfig, launch, train_reference
from heteropp.plan import Plan, StagePlan
from heteropp.spec import ModelSpec, SpecError
from heteropp.engine.checks import check_run
from tests.heteropp.heteropp_helpers import RTOL, STEPS, check_losses, full_grads, losses, ref_grads, rel

MODEL = ModelSpec("kv2", layers=4, hidden=32, heads=8, kv_heads=2, ffn=64, vocab=128, seq_len=16)
PLAN = Plan([StagePlan("A", 4, 2, False), StagePlan("B", 1, 1, False), StagePlan("A", 2, 1, True)], dp=1,
            micro_batch_size=1, micro_batches=4, num_layers=MODEL.layers)
SCHEDULES = ("1f1b", "zbh1")


@functools.lru_cache(maxsize=None)
def run() -> dict:
    cfg = RunConfig(plan=PLAN.to_dict(), model=RunConfig.model_dict(MODEL), steps=STEPS, schedules=list(SCHEDULES),
                    backend="gloo", chip_map={"A": "cpu", "B": "cpu"}, collect_grads=True, timeout_s=60)
    return launch(cfg)


@functools.lru_cache(maxsize=None)
def reference() -> dict:
    return train_reference(MODEL, STEPS, PLAN.global_batch, collect_grads=True, verbose=False)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_tp_above_kv_heads_matches_reference(schedule: str) -> None:
    want = reference()
    check_losses(losses(run(), schedule), want["losses"], schedule)
    got, want_grads = full_grads(run(), schedule), ref_grads(want)
    assert set(got) == set(want_grads)
    worst = max((rel(got[n], want_grads[n]), n) for n in want_grads)
    assert worst[0] < RTOL, f"{schedule}: gradient of {worst[1]} off by {worst[0]:.2e}"


def test_tp_that_neither_divides_nor_multiplies_kv_heads_is_refused() -> None:
    m = ModelSpec("kv6", layers=2, hidden=48, heads=12, kv_heads=6, ffn=64, vocab=128, seq_len=8)
    bad = Plan([StagePlan("A", 4, 2, False)], dp=1, micro_batch_size=1, micro_batches=2, num_layers=2)
    with pytest.raises(SpecError, match=r"stages\[0\]\.tp.*kv_heads=6"):
        check_run(bad, m, "plan.json", {"A": "cpu"}, ["1f1b"])
