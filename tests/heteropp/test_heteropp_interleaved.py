"""Interleaved 1F1B (virtual stages: each group of chips holds several non-adjacent layer chunks) from the
schedule registry: the simulator reaches Megatron's closed form, and the engine trains an interleaved plan
(chunks wrapping from the last group back to the first, TP resharded between them) to the single-process
reference."""
from __future__ import annotations

import pytest

from heteropp.auto.simulator import StageTimes, simulate
from heteropp.engine import launch
from heteropp.plan import Plan, StagePlan
from heteropp.schedules import ScheduleError, build
from heteropp.spec import SpecError
from tests.heteropp.heteropp_helpers import (MODEL, RTOL, check_losses, config, full_grads, losses, ref_grads,
                                             reference, rel)


@pytest.mark.parametrize("p,v,m", [(2, 2, 4), (4, 2, 8), (3, 3, 6), (4, 1, 8)])
def test_interleaved_reaches_the_closed_form(p, v, m):
    """Equal virtual stages (F = f / v, B = b / v), free links: m (f + b) + (p - 1) (f + b) / v, the
    1F1B bubble divided by the chunks (Megatron's interleaved schedule)."""
    f, b = 1.0, 2.0
    st = [StageTimes(f / v, b / v, 0.0, 0.0)] * (p * v)
    got = simulate(st, [0.0] * (p * v - 1), m, build("interleaved", p, m, {"chunks": v})).iteration_time_s
    assert got == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v)


def test_interleaved_needs_micro_batches_in_groups_of_the_stages():
    with pytest.raises(ScheduleError, match="not a multiple of 2"):
        build("interleaved", 2, 3, {"chunks": 2})


PLAN = Plan([StagePlan("A", 1, 1), StagePlan("B", 2, 1), StagePlan("A", 1, 1), StagePlan("B", 2, 1)], dp=1,
            micro_batch_size=1, micro_batches=4, num_layers=MODEL.layers, schedule="interleaved",
            schedule_params={"chunks": 2})


def test_engine_trains_an_interleaved_plan_to_the_reference():
    assert PLAN.devices == 2 and PLAN.world_size == 3
    res, want = launch(config(PLAN, ("interleaved",))), reference(PLAN.global_batch)
    check_losses(losses(res, "interleaved"), want["losses"], "interleaved")
    got, want_grads = full_grads(res, "interleaved"), ref_grads(want)
    assert max(rel(got[n], want_grads[n]) for n in want_grads) < RTOL


def test_interleaved_plan_chunks_must_sit_on_their_group():
    d = PLAN.to_dict()
    d["stages"][2]["tp"] = 2
    with pytest.raises(SpecError, match=r"stages\[2\].*runs on the chips of stages\[0\]"):
        Plan.from_dict(d)


def test_heteroauto_simulates_an_interleaved_plan(tmp_path, capsys):
    """The command line simulates the plan's virtual stages; interleaving two chunks per group beats the same
    layers as two plain stages under 1F1B (smaller bubble), with the same chips."""
    import json
    from pathlib import Path

    from heteropp.auto.cli import main
    ex = Path(__file__).resolve().parents[2] / "examples"
    args = ["--cluster", str(ex / "clusters" / "two-cpu.yaml"), "--model", "tiny", "--train",
            str(ex / "training" / "tiny.yaml")]
    chunked = Plan([StagePlan("big", 1, 2), StagePlan("small", 1, 2), StagePlan("big", 1, 2), StagePlan("small", 1, 2)],
                   dp=2, micro_batch_size=1, micro_batches=4, schedule="interleaved", schedule_params={"chunks": 2})
    plain = Plan([StagePlan("big", 1, 4), StagePlan("small", 1, 4)], dp=2, micro_batch_size=1, micro_batches=4)
    times = {}
    for name, plan in (("chunked", chunked), ("plain", plain)):
        path, sim = tmp_path / f"{name}.json", tmp_path / f"{name}.sim.json"
        plan.save(path)
        assert main(["simulate", str(path), *args, "--json", str(sim)]) == 0
        times[name] = json.loads(sim.read_text())["iteration_time_s"]
    assert times["chunked"] < times["plain"]
