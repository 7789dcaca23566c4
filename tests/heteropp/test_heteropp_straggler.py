"""A slowed chip is detected from per-stage step timings against the plan's cost-model prediction (real
processes; one rank's compute actions are slowed by a fixed delay, standing in for a throttled chip), and an
even run raises no alarm."""
from __future__ import annotations

import json

from heteropp.engine import RunConfig, launch
from heteropp.plan import Plan, StagePlan
from heteropp.spec import PRESETS

STEPS = 7


def _run(tmp_path, name: str, **kw) -> list[dict]:
    # equal predictions for two equal halves of the tiny model (the head is small beside four layers)
    plan = Plan([StagePlan("A", 1, 4, est_time_s=0.01), StagePlan("B", 1, 4, est_time_s=0.01)], dp=1,
                micro_batch_size=1, micro_batches=4, num_layers=8)
    log = tmp_path / f"{name}.jsonl"
    launch(RunConfig(plan=plan.to_dict(), model=RunConfig.model_dict(PRESETS["tiny"]), steps=STEPS, backend="gloo",
                     chip_map={"A": "cpu", "B": "cpu"}, loss_log=str(log), **kw))
    return [json.loads(x) for x in log.read_text().splitlines()]


def test_a_slowed_stage_is_reported_and_an_even_run_is_not(tmp_path) -> None:
    slowed = _run(tmp_path, "slow", slow_rank=1, slow_s=0.1)
    flagged = [r["stragglers"] for r in slowed if "stragglers" in r]
    assert flagged and all(set(f) == {"1"} and f["1"] > 1.5 for f in flagged), slowed
    assert "stragglers" not in slowed[0]  # judged over a window of steps, not one
    even = _run(tmp_path, "even")
    assert not any("stragglers" in r for r in even)
